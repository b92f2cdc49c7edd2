// The analysis table: one entry per analysis that is a job (every
// AnalysisService RPC that runs model code). An entry names the job kind,
// the request and response types, and the module function that validates a
// request, resolves its defaults into a canonical key, estimates the job's
// memory and says what the job does (server/scheduler/analyses/<name>.cc,
// registered by a CIRCUITLAB_JOB_ANALYSIS line at its end). The RPC layer
// serves every AnalysisService method whose request type has an entry
// (rpc/analysis_service.cc), and AnalysisCore::Run queues it: adding an
// analysis is its proto messages, its module here and its engine code
// (server/engine/analysis/registry.h), with no list to edit.
//
// Entries register at start-up; the scheduler library is linked whole
// (server/scheduler/CMakeLists.txt).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/common/cancel.h"
#include "server/engine/api.h"
#include "server/scheduler/analysis_jobs.h"

namespace circuitlab::scheduler {

class AnalysisCore;

// What a module makes of a valid request: the job to queue (or to answer
// from the store).
template <typename Response>
struct AnalysisPlan {
  int64_t run_id = 0;         // store::Store::kNoRun for a spec sent with the request
  std::string key;            // the canonical request, serialized (its hash keys stored answers)
  std::string version;        // hashed after the key (AnalysisJobRequest::version)
  uint64_t memory_bytes = 0;  // the job's estimated peak (JobMemory)
  // The DONE response (its result fields and the echoes of the request the
  // module wants); the table sets state and progress.
  std::function<absl::StatusOr<Response>(const std::function<void(double)>& progress, const CancelToken* cancel)> work;
  // Optional: called on every answer not read from the store (a pending
  // one too), for echoes of the request a client needs while it waits.
  std::function<void(Response*)> on_answer;
};

// The plan of a job that is one engine call: the canonical request is the
// key, the work Analyze(input, canonical), then `finish` (echoes of the
// request, such as run_id and step) on the DONE response.
template <typename Response, typename Request>
AnalysisPlan<Response> EnginePlan(engine::Analyzer& analyzer, int64_t run_id, const Request& canonical,
                                  engine::AnalysisInput input, uint64_t memory_bytes,
                                  std::function<void(Response&)> finish = {}) {
  AnalysisPlan<Response> plan;
  plan.run_id = run_id;
  plan.key = canonical.SerializeAsString();
  plan.memory_bytes = memory_bytes;
  plan.work = [analyzer = &analyzer, input = std::move(input), canonical, finish = std::move(finish)](
                  const std::function<void(double)>& progress,
                  const CancelToken* cancel) -> absl::StatusOr<Response> {
    absl::StatusOr<Response> done = engine::Analyze<Response>(*analyzer, input, canonical, progress, cancel);
    if (done.ok() && finish) finish(*done);
    return done;
  };
  return plan;
}

// The version of answers whose requests or results name layers or heads
// (attention, activations, interventions, exports): those stored before
// layers and heads counted from 1 on every surface meant other layers by the
// same numbers, so they are not read back (recomputed once).
inline constexpr char kLayersFromOne[] = "/layers-from-1";

// A planned job as AnalysisJobs takes it, with its answer's decoration.
struct PlannedJob {
  AnalysisJobRequest job;
  std::function<void(google::protobuf::Message*)> on_answer;  // may be empty
};

struct AnalysisEntry {
  std::string kind;                                    // the job's kind and the stored answers': "detect_circuit"
  const google::protobuf::Message* request = nullptr;  // the types' default instances
  const google::protobuf::Message* response = nullptr;
  // Validation and canonicalisation on the calling thread (the store, no
  // model code): InvalidArgument naming the field, NotFound, ...; then the
  // job as AnalysisJobs takes it (kind, owner and force are the caller's).
  std::function<absl::StatusOr<PlannedJob>(AnalysisCore& core, const google::protobuf::Message& request)> plan;
};

// Adds an entry. A request type registered twice is a programming error
// (aborts at start-up). Returns true.
bool RegisterJobAnalysis(AnalysisEntry entry);

// The typed form: `plan(core, request)` returns
// absl::StatusOr<AnalysisPlan<Response>>.
template <typename Request, typename Response, typename F>
bool RegisterJobAnalysis(std::string kind, F plan) {
  AnalysisEntry e;
  e.kind = std::move(kind);
  e.request = &Request::default_instance();
  e.response = &Response::default_instance();
  e.plan = [plan](AnalysisCore& core, const google::protobuf::Message& request) -> absl::StatusOr<PlannedJob> {
    absl::StatusOr<AnalysisPlan<Response>> p = plan(core, static_cast<const Request&>(request));
    if (!p.ok()) return p.status();
    PlannedJob planned;
    if (p->on_answer) {
      planned.on_answer = [f = p->on_answer](google::protobuf::Message* m) { f(static_cast<Response*>(m)); };
    }
    AnalysisJobRequest& job = planned.job;
    job.run_id = p->run_id;
    job.key = std::move(p->key);
    job.version = std::move(p->version);
    job.memory_bytes = p->memory_bytes;
    job.work = [work = std::move(p->work)](const std::function<void(double)>& progress,
                                           const CancelToken* cancel) -> absl::StatusOr<std::string> {
      absl::StatusOr<Response> done = work(progress, cancel);
      if (!done.ok()) return done.status();
      done->set_state(static_cast<decltype(done->state())>(v1::ANALYSIS_STATE_DONE));
      done->set_progress(1.0);
      return done->SerializeAsString();
    };
    return planned;
  };
  return RegisterJobAnalysis(std::move(e));
}

// The entry for a request type, or null.
const AnalysisEntry* FindJobAnalysis(const google::protobuf::Descriptor* request);
// Every entry, by kind.
std::vector<const AnalysisEntry*> JobAnalyses();

#define CIRCUITLAB_JOB_ANALYSIS_CONCAT_(a, b) a##b
#define CIRCUITLAB_JOB_ANALYSIS_CONCAT(a, b) CIRCUITLAB_JOB_ANALYSIS_CONCAT_(a, b)
// Registers an entry at start-up: CIRCUITLAB_JOB_ANALYSIS("detect_circuit",
// v1::DetectCircuitRequest, v1::DetectCircuitResponse, PlanDetectCircuit).
#define CIRCUITLAB_JOB_ANALYSIS(kind, Request, Response, plan)                                   \
  [[maybe_unused]] static const bool CIRCUITLAB_JOB_ANALYSIS_CONCAT(kJobAnalysis, __COUNTER__) = \
      ::circuitlab::scheduler::RegisterJobAnalysis<Request, Response>(kind, plan)

}  // namespace circuitlab::scheduler
