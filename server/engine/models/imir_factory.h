// The IMIR model a spec asks for (model.imir: layers, heads, FULL or
// COORDINATES over the paper or complete basis of the task's symmetry).
// Engine-private (includes LibTorch).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "circuitlab/v1/spec.pb.h"
#include "server/engine/models/imir_model.h"
#include "server/engine/tasks/block_task.h"

namespace circuitlab::engine {

// The spec's model for `task` (FULL or COORDINATES), not initialised;
// float64 for numerical checks (SCIENCE.md 0.3).
std::unique_ptr<ImirModel> MakeModel(const v1::ExperimentSpec& resolved, const BlockTask& task, int64_t ensemble,
                                     torch::Device device, bool float64 = false);

}  // namespace circuitlab::engine
