// The analyses of the IMIR family (the block model of SCIENCE.md B.1 on its
// synthetic tasks), one file each: projection (C.4), the invariance check
// (C.6), circuit detection (D.1), weight-space and hook-point interventions
// (D.6), run labels (D.2/D.3) and the data-dependence check (D.4). Each
// takes its canonical request (api.h's Analyzer) and answers the
// response's result fields. Engine-private (LibTorch in the .cc files).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/common/cancel.h"
#include "server/engine/api.h"

namespace circuitlab::engine {

using AnalysisProgress = std::function<void(double)>;

absl::StatusOr<v1::ProjectCheckpointResponse> ImirProject(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                          const v1::ProjectCheckpointRequest& request);

absl::StatusOr<v1::CheckInvarianceResponse> ImirInvariance(const v1::ExperimentSpec& spec,
                                                           const v1::CheckInvarianceRequest& request,
                                                           const AnalysisProgress& progress, const CancelToken* cancel);

absl::StatusOr<v1::DetectCircuitResponse> ImirDetectCircuit(const v1::ExperimentSpec& spec,
                                                            const std::string& checkpoint,
                                                            const v1::DetectCircuitRequest& request,
                                                            const AnalysisProgress& progress,
                                                            const CancelToken* cancel);

absl::StatusOr<v1::InterveneResponse> ImirIntervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                    const v1::InterveneRequest& request,
                                                    const std::map<int, StoredCheckpoint>& swap_sources);

absl::StatusOr<v1::LabelRunResponse> ImirLabelRun(const v1::ExperimentSpec& spec,
                                                  const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                                  const v1::LabelRunRequest& request, const AnalysisProgress& progress,
                                                  const CancelToken* cancel);

absl::StatusOr<v1::CheckDataDependenceResponse> ImirDataDependence(const v1::ExperimentSpec& spec,
                                                                   const v1::CheckDataDependenceRequest& request,
                                                                   const AnalysisProgress& progress,
                                                                   const CancelToken* cancel);

}  // namespace circuitlab::engine
