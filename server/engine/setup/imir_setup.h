// An IMIR run's model as training and analysis both set it up: the seeds of
// its evaluation sets, its initialisation from the spec and its weights read
// from a checkpoint. Engine-private (LibTorch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "circuitlab/v1/spec.pb.h"
#include "server/engine/models/imir_factory.h"
#include "server/engine/models/imir_model.h"
#include "server/engine/setup/checkpoint_io.h"
#include "server/engine/tasks/block_task.h"

namespace circuitlab::engine {

// Seed of a member's evaluation set `mode` (the same sequences at every
// checkpoint, and in the circuit analyses).
uint64_t EvalSeed(uint64_t seed, SampleMode mode);

// Initialises member e as members[e] says (the first's init scheme is every
// member's): `init` with the member's init seed (DeriveSeed(seed, "init"));
// COORDINATES with INIT_SCHEME_PROJECTED projects the FULL model's NORMAL
// init of the same seed; then the member's initial_coordinates override.
void InitializeModel(const std::vector<v1::ExperimentSpec>& members, ImirModel& model);

// Reads only the weights of a checkpoint into `model` (no optimiser, no
// evaluation sets). InvalidArgument when shapes or format do not match.
absl::Status LoadWeights(const std::string& checkpoint, ImirModel& model);

}  // namespace circuitlab::engine
