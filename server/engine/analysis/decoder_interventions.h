// Activation interventions at the hook points of a decoder model on a latent
// task (SCIENCE.md D.6): zero, mean, resample, project-out, project-onto,
// add, patch and replace-convex, applied in order in one forward pass,
// evaluated clean against intervened on the same sequences. Engine-private
// (LibTorch).
#pragma once

#include "absl/status/statusor.h"
#include "server/engine/api.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/tasks/latent_task.h"
#include "server/engine/tasks/regression_task.h"

namespace circuitlab::engine {

// Evaluation sets "id", "ood" and (with minors) "minor", as the trainer's;
// every op must be an activation op. InvalidArgument names the op and the
// field at fault (hook point, vector width, position, set name).
absl::StatusOr<v1::InterveneResponse> InterveneDecoder(const DecoderModel& model, const LatentTaskGenerator& task,
                                                       const v1::InterveneRequest& request);

// The same ops (but replace-convex) on the caller's prompts
// (request.prompts), read at each prompt's last position: one effect named
// "prompts" (decoder_prompts.cc).
absl::StatusOr<v1::InterveneResponse> InterveneDecoderPrompts(const DecoderModel& model,
                                                              const v1::InterveneRequest& request);

// The same ops on the regression decoder of an E2 run (B.3; positions are
// sequence positions of the mapsto layout, 3i + 1 predicts y_i). Effects
// with the squared-error analogues: loss = the squared error of every y_i,
// kl_clean = the mean squared change of the prediction, kl_ref = the squared
// distance to the set's Bayes predictor ("bayes": retrieval over the known
// tasks on id; "ridge" on ood and minor); accuracy is not defined (0).
absl::StatusOr<v1::InterveneResponse> InterveneRegression(const DecoderModel& model,
                                                          const RegressionTaskGenerator& task,
                                                          const v1::InterveneRequest& request);

}  // namespace circuitlab::engine
