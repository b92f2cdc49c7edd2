// A torch-free engine::Analyzer for scheduler and RPC tests: every analysis
// answers UNIMPLEMENTED; a test overrides the ones it exercises.
#pragma once

#include "server/engine/engine.h"

namespace circuitlab::testing {

class UnimplementedAnalyzer : public engine::Analyzer {
 public:
  absl::StatusOr<engine::CheckpointProjection> ProjectCheckpoint(const v1::ExperimentSpec&, const std::string&,
                                                                 engine::Selection) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::InvarianceReport> CheckInvariance(const v1::ExperimentSpec&, const engine::InvarianceRequest&,
                                                           const std::function<void(double)>&,
                                                           const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::DetectReport> DetectCircuit(const v1::ExperimentSpec&, const std::string&,
                                                     const engine::DetectRequest&, const std::function<void(double)>&,
                                                     const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::InterveneReport> Intervene(const v1::ExperimentSpec&, const std::string&,
                                                    const engine::InterveneRequest&) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<std::vector<engine::DataDependenceRow>> CheckDataDependence(
      const v1::ExperimentSpec&, const std::vector<engine::DataDependencePoint>&, const engine::DataDependenceConfig&,
      const std::function<void(double)>&, const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::LabelReport> LabelRun(const v1::ExperimentSpec&,
                                               const std::vector<std::pair<int64_t, std::string>>&,
                                               const engine::LabelRequest&, const std::function<void(double)>&,
                                               const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
};

}  // namespace circuitlab::testing
