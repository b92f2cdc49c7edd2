// A torch-free engine::Analyzer for scheduler and RPC tests: every analysis
// answers UNIMPLEMENTED; a test overrides the ones it exercises.
#pragma once

#include "server/engine/engine.h"

namespace circuitlab::testing {

class UnimplementedAnalyzer : public engine::Analyzer {
 public:
  absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(const v1::ExperimentSpec&, const std::string&,
                                                                  const v1::ProjectCheckpointRequest&) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<v1::CheckInvarianceResponse> CheckInvariance(const v1::ExperimentSpec&,
                                                              const v1::CheckInvarianceRequest&, const Progress&,
                                                              const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<v1::DetectCircuitResponse> DetectCircuit(const v1::ExperimentSpec&, const std::string&,
                                                          const v1::DetectCircuitRequest&, const Progress&,
                                                          const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<v1::InterveneResponse> Intervene(const v1::ExperimentSpec&, const std::string&,
                                                  const v1::InterveneRequest&,
                                                  const std::map<int, engine::StoredCheckpoint>&) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<v1::CheckDataDependenceResponse> CheckDataDependence(const v1::ExperimentSpec&,
                                                                      const v1::CheckDataDependenceRequest&,
                                                                      const Progress&, const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> AnalyzeTaskVectors(const v1::ExperimentSpec&, const std::string&,
                                                                    const v1::AnalyzeTaskVectorsRequest&,
                                                                    const Progress&, const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<v1::LabelRunResponse> LabelRun(const v1::ExperimentSpec&,
                                                const std::vector<std::pair<int64_t, std::string>>&,
                                                const v1::LabelRunRequest&, const Progress&,
                                                const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
};

}  // namespace circuitlab::testing
