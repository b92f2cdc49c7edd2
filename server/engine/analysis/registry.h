// The engine's analysis table: which code answers an analysis request for a
// run of each model family. One entry per (family, request type), registered
// by the file that implements it (a CIRCUITLAB_ENGINE_ANALYSIS line at its
// end), so adding an analysis touches no list: the torch analyzer
// (engine.cc) looks entries up by the run's family (families/family.h) and
// the request's protobuf type, and a family's offer (the FailedPrecondition
// of an analysis it lacks) is read from here. Engine-private; torch-free.
//
// The engine library is linked whole (server/engine/CMakeLists.txt): an
// entry's file is kept although nothing calls it by name.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/common/cancel.h"
#include "server/engine/api.h"

namespace circuitlab::engine {

using AnalysisProgress = std::function<void(double)>;

// One entry: fills `response` (the request type's response) from `input`.
using AnalysisFn = std::function<absl::Status(const AnalysisInput& input, const google::protobuf::Message& request,
                                              google::protobuf::Message* response, const AnalysisProgress& progress,
                                              const CancelToken* cancel)>;

// Adds `fn` for requests of type `request` on runs of `family` ("imir",
// "latent", "regression"). A second entry for the same pair is a
// programming error (aborts at start-up). Returns true.
bool RegisterAnalysis(std::string_view family, const google::protobuf::Descriptor* request, AnalysisFn fn);

// The typed form: `f(input, const Request&, progress, cancel)` returns
// absl::StatusOr<Response>.
template <typename Request, typename Response, typename F>
bool RegisterAnalysis(std::string_view family, F f) {
  return RegisterAnalysis(
      family, Request::descriptor(),
      [f](const AnalysisInput& input, const google::protobuf::Message& request, google::protobuf::Message* response,
          const AnalysisProgress& progress, const CancelToken* cancel) -> absl::Status {
        absl::StatusOr<Response> out = f(input, static_cast<const Request&>(request), progress, cancel);
        if (!out.ok()) return out.status();
        static_cast<Response*>(response)->Swap(&*out);
        return absl::OkStatus();
      });
}

// The entry for `request` on `family`, or null.
const AnalysisFn* FindAnalysis(std::string_view family, const google::protobuf::Descriptor* request);

// The analyses `family` has, by RPC name ("DetectCircuit, Intervene and
// LabelRun"), for the error of one it lacks.
std::string AnalysesOf(std::string_view family);

// The RPC an analysis request belongs to: "DetectCircuit" for
// DetectCircuitRequest.
std::string AnalysisName(const google::protobuf::Descriptor* request);

#define CIRCUITLAB_ANALYSIS_CONCAT_(a, b) a##b
#define CIRCUITLAB_ANALYSIS_CONCAT(a, b) CIRCUITLAB_ANALYSIS_CONCAT_(a, b)
// Registers an entry at start-up: CIRCUITLAB_ENGINE_ANALYSIS("imir",
// v1::DetectCircuitRequest, v1::DetectCircuitResponse, fn). Unique per line
// under unity builds.
#define CIRCUITLAB_ENGINE_ANALYSIS(family, Request, Response, fn)                               \
  [[maybe_unused]] static const bool CIRCUITLAB_ANALYSIS_CONCAT(kEngineAnalysis, __COUNTER__) = \
      ::circuitlab::engine::RegisterAnalysis<Request, Response>(family, fn)

}  // namespace circuitlab::engine
