// A torch-free engine::Analyzer for scheduler and RPC tests: every analysis
// answers UNIMPLEMENTED unless the test gave an answer for its request type
// with On<Request, Response>(f).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "server/common/thread_cancel.h"
#include "server/engine/api.h"

namespace circuitlab::testing {

class UnimplementedAnalyzer : public engine::Analyzer {
 public:
  absl::Status Analyze(const engine::AnalysisInput& input, const google::protobuf::Message& request,
                       google::protobuf::Message* response, const Progress& progress,
                       const CancelToken* cancel) override {
    auto it = answers_.find(request.GetDescriptor()->full_name());
    if (it == answers_.end()) return absl::UnimplementedError("not in this fake");
    return it->second(input, request, response, progress, cancel);
  }

 protected:
  // `f(input, request, progress, cancel)` returns absl::StatusOr<Response>.
  template <typename Request, typename Response, typename F>
  void On(F f) {
    answers_[Request::descriptor()->full_name()] =
        [f](const engine::AnalysisInput& input, const google::protobuf::Message& request,
            google::protobuf::Message* response, const Progress& progress, const CancelToken* cancel) -> absl::Status {
      absl::StatusOr<Response> out = f(input, static_cast<const Request&>(request), progress, cancel);
      if (!out.ok()) return out.status();
      static_cast<Response*>(response)->Swap(&*out);
      return absl::OkStatus();
    };
  }

 private:
  std::map<std::string, std::function<absl::Status(const engine::AnalysisInput&, const google::protobuf::Message&,
                                                   google::protobuf::Message*, const Progress&, const CancelToken*)>>
      answers_;
};

// Interventions that cannot finish until they are cancelled (the executor
// installs the job's token on its worker thread, as for the real engine).
class GatedAnalyzer : public UnimplementedAnalyzer {
 public:
  GatedAnalyzer() {
    On<v1::InterveneRequest, v1::InterveneResponse>(
        [this](const engine::AnalysisInput&, const v1::InterveneRequest&, const Progress&,
               const CancelToken*) -> absl::StatusOr<v1::InterveneResponse> {
          ++started;
          while (!ThreadCancelToken()->stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          return absl::CancelledError("stopped");
        });
  }
  std::atomic<int> started{0};
};

}  // namespace circuitlab::testing
