// Circuit analyses of IMIR checkpoints (SCIENCE.md D.1 detection, D.2/D.3
// labels, D.6 weight-space interventions). Engine-private (LibTorch).
//
// Every analysis works on dense copies of a checkpoint's weights (a FULL
// model with one member), whatever the run's parameterisation: a coordinate
// vector c over a basis becomes weights through the projector
// (W_S(c) = sum_a c_a B_a), an edit of coordinates becomes W + W_S(c') -
// W_S(c) (so a FULL model keeps its off-manifold part), and a head ablation
// zeroes the weight blocks that read the head's output or any copy of it,
// which is exactly zeroing the head's output block Y_{l,h}.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/common/cancel.h"
#include "server/engine/engine.h"

namespace circuitlab::engine {

absl::StatusOr<DetectReport> DetectCircuitImpl(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                               const DetectRequest& request,
                                               const std::function<void(double)>& progress,
                                               const CancelToken* cancel);

absl::StatusOr<InterveneReport> InterveneImpl(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                              const InterveneRequest& request);

absl::StatusOr<LabelReport> LabelRunImpl(const v1::ExperimentSpec& spec,
                                         const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                         const LabelRequest& request, const std::function<void(double)>& progress,
                                         const CancelToken* cancel);

// The task's primary set for circuit metrics: icl_rare for associative
// recall, else the first evaluation set.
std::string PrimaryEvalSet(const v1::ExperimentSpec& spec);

}  // namespace circuitlab::engine
