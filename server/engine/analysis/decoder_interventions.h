// Activation interventions at the hook points of a decoder model on a latent
// task (SCIENCE.md D.6): zero, mean, resample, project-out, project-onto,
// add and patch, applied in order in one forward pass, evaluated clean
// against intervened on the same sequences. Engine-private (LibTorch).
#pragma once

#include "absl/status/statusor.h"
#include "server/engine/engine.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/tasks/latent_task.h"

namespace circuitlab::engine {

// Evaluation sets "id", "ood" and (with minors) "minor", as the trainer's;
// every op must be an activation op. InvalidArgument names the op and the
// field at fault (hook point, vector width, position, set name).
absl::StatusOr<InterveneReport> InterveneDecoder(const DecoderModel& model, const LatentTaskGenerator& task,
                                                 const InterveneRequest& request);

}  // namespace circuitlab::engine
