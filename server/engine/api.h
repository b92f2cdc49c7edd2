// The engine's torch-free API, implemented by the facade engine.cc: what the
// scheduler, the worker and the tests call to train and analyse. Everything
// that touches tensors lives behind it in engine .cc files and
// engine-private headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "circuitlab/v1/spec.pb.h"
#include "google/protobuf/message.h"
#include "server/common/cancel.h"
#include "server/engine/basis/basis.h"
#include "server/engine/spec.h"

namespace circuitlab::engine {

struct Metric {
  std::string name;  // e.g. "train/loss", "eval/icl_rare/accuracy"
  double value = 0;
};

// Receives what a training run produces. Called on the training thread;
// implementations must not block for long (they slow training).
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  // Metrics recorded at `step` (1-based, after the step's update).
  virtual void OnMetrics(int64_t step, const std::vector<Metric>& metrics) = 0;
  // Progress after `step`, at most a few times a second.
  virtual void OnProgress(int64_t step, double steps_per_second) = 0;
  // A checkpoint of the state after `step`. An error fails the run.
  virtual absl::Status OnCheckpoint(int64_t step, const std::string& bytes) = 0;
  // The basis coordinates will be reported in; once per attempt, before any
  // OnCoordinates for it. An error fails the run.
  virtual absl::Status OnBasis(const Basis& basis) { return absl::OkStatus(); }
  // Coordinates (Basis::coords order) of the weights after `step`.
  virtual void OnCoordinates(int64_t step, Selection selection, const std::vector<double>& values) {}
};

struct TrainRequest {
  v1::ExperimentSpec spec;  // resolved (ResolveSpec)
  std::string device = "cpu";  // "cpu" or "cuda:N"
  // Resume from this checkpoint (bytes an earlier OnCheckpoint produced for
  // the same spec). The resumed run continues bit-for-bit on CPU.
  std::optional<std::string> resume_from;
  const CancelToken* cancel = nullptr;  // polled every step; may be null
  int intra_op_threads = 1;
};

enum class TrainEnd {
  kCompleted,  // every step ran; a final checkpoint was delivered
  kCancelled,  // stopped on a kCancel request
  kPreempted,  // stopped on a kPreempt request; a checkpoint of the last step was delivered
};

struct TrainOutcome {
  TrainEnd end = TrainEnd::kCompleted;
  int64_t last_step = 0;
};

// Runs training runs. Thread-safe: one instance serves every worker.
class Executor {
 public:
  virtual ~Executor() = default;
  // InvalidArgument for a checkpoint that does not belong to the spec,
  // Internal for failures inside LibTorch (the message says what failed).
  virtual absl::StatusOr<TrainOutcome> Train(const TrainRequest& request, TrainObserver& observer) = 0;
  // Several runs whose specs differ only in their seed and their family's
  // member settings (PackableTogether: the IMIR initial_coordinates, the
  // latent tasks' diversity and p_minor), trained as one ensemble sharing
  // every tensor op: one member per request,
  // each reporting to its own observer and writing its own checkpoints (the
  // ones a run alone would write, so it resumes alone). Requests must not
  // resume. A member whose token asks kCancel drops out (kCancelled), and one
  // that reaches its early stop ends there (kCompleted), while the others go
  // on; kPreempt on any member checkpoints and preempts them all.
  // One answer per request. The default trains them one after another.
  // The evaluation metrics runs of a resolved spec record ("eval/<set>/
  // <name>" for every set of its task; a superset where a metric depends on
  // the sampled data), so that training.stop_metric is checked before a run
  // is queued. Empty (nothing checked) when the executor cannot tell.
  virtual std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) { return {}; }
  // Whether `bytes` is a checkpoint this executor could resume a one-member
  // run of `spec` from at `step` (its format, its spec's and seed's
  // fingerprint, its step): InvalidArgument or DataLoss saying why. A remote
  // worker's upload is checked so before it is stored. OK when the executor
  // cannot tell.
  virtual absl::Status CheckCheckpoint(const v1::ExperimentSpec& spec, int64_t step, const std::string& bytes) {
    return absl::OkStatus();
  }
  virtual std::vector<absl::StatusOr<TrainOutcome>> TrainPack(const std::vector<TrainRequest>& requests,
                                                              const std::vector<TrainObserver*>& observers) {
    std::vector<absl::StatusOr<TrainOutcome>> out;
    for (size_t i = 0; i < requests.size(); ++i) out.push_back(Train(requests[i], *observers[i]));
    return out;
  }
};

// The LibTorch executor.
std::unique_ptr<Executor> MakeTorchExecutor();

// Executor::CheckCheckpoint for the torch executor's checkpoints.
absl::Status CheckCheckpoint(const v1::ExperimentSpec& spec, int64_t step, const std::string& bytes);

// The evaluation metrics the torch executor's runs of a resolved spec record
// (Executor::EvalMetricNames).
std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved);

// A stored checkpoint and the (resolved) spec it was trained under.
struct StoredCheckpoint {
  v1::ExperimentSpec spec;
  std::string bytes;
};

// What an analysis reads: its run's spec and the stored checkpoints it needs
// (the scheduler's module for the analysis decides which).
struct AnalysisInput {
  v1::ExperimentSpec spec;  // resolved
  // (step, bytes), ascending: one for an analysis of a checkpoint, every one
  // of the run for LabelRun, none for an analysis of the spec alone.
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  // Intervene: by index into request.interventions, the checkpoint each
  // OP_SWAP_COORDINATES reads.
  std::map<int, StoredCheckpoint> sources;
  // The newest checkpoint's bytes (empty when there is none).
  const std::string& checkpoint() const {
    static const std::string kNone;
    return checkpoints.empty() ? kNone : checkpoints.back().second;
  }
};

// Pure analyses of stored checkpoints. Thread-safe. One entry point serves
// every analysis: `request` is the analysis's canonical request (an
// analysis_service.proto `<Name>Request`, every default resolved by the
// scheduler) and `response` its `<Name>Response`, whose result fields it
// fills; the caller sets the job fields (state, progress, run, step,
// job_id). Which code answers is looked up by the request's type and the
// run's model family (the engine's analysis table, analysis/registry.h). A
// request field out of its range is InvalidArgument naming it; an analysis
// the run's model family does not have is FailedPrecondition naming the
// ones it has. `progress(fraction)` is called as the analysis goes; it stops
// with Cancelled when `cancel` asks.
class Analyzer {
 public:
  using Progress = std::function<void(double)>;
  virtual ~Analyzer() = default;
  virtual absl::Status Analyze(const AnalysisInput& input, const google::protobuf::Message& request,
                               google::protobuf::Message* response, const Progress& progress,
                               const CancelToken* cancel) = 0;
  // The evaluation sets a run of the resolved spec has (the <set> of its
  // eval/<set>/<metric> names), so that a request naming another one is
  // refused before a job is queued. Empty (nothing checked) when the
  // analyzer cannot tell.
  virtual std::vector<std::string> EvalSets(const v1::ExperimentSpec& resolved) { return {}; }
};

// Analyzer::Analyze, typed: `Response` must be the request's response type.
template <typename Response, typename Request>
absl::StatusOr<Response> Analyze(Analyzer& analyzer, const AnalysisInput& input, const Request& request,
                                 const Analyzer::Progress& progress = {}, const CancelToken* cancel = nullptr) {
  Response out;
  const Analyzer::Progress report = progress ? progress : [](double) {};
  if (absl::Status s = analyzer.Analyze(input, request, &out, report, cancel); !s.ok()) return s;
  return out;
}

std::unique_ptr<Analyzer> MakeTorchAnalyzer();

// CUDA devices LibTorch can use (0 on CPU-only builds, and in CUDA builds on
// a machine without a GPU or driver).
int CudaDeviceCount();

// The LibTorch this binary runs on, for start-up logs, `circuitlab health`
// and the worker's refusal of a device it does not have.
struct TorchRuntime {
  std::string version;       // LibTorch's, e.g. "2.6.0"
  std::string cuda_runtime;  // the CUDA runtime it was built with, e.g. "12.4"; empty: a CPU-only LibTorch
  int cuda_devices = 0;      // CudaDeviceCount()
  std::vector<uint64_t> cuda_memory_bytes;  // each device's memory; empty when it cannot be read
  // "LibTorch 2.6.0 (CUDA 12.4), 1 CUDA device" / "LibTorch 1.13.0 (CPU only)".
  std::string Describe() const;
};
TorchRuntime DescribeTorchRuntime();

// Process-wide runtime settings; call once at start-up before any training:
// BLAS threads (OpenBLAS) pinned to `blas_threads`, and glibc malloc
// thresholds raised so freed activation buffers are reused rather than
// returned to the OS every step.
void ConfigureRuntime(int blas_threads);

// Settings for training on CUDA devices; call once at start-up, before any
// CUDA work, when CUDA devices will be used. `deterministic`: cuBLAS with a
// fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set), no cuDNN
// autotuning, LibTorch's deterministic algorithms (the gathers' backward, a
// scatter-add, among them; an op without one warns), so a run repeats
// bit-for-bit on the same GPU and software; off: somewhat faster.
void ConfigureCuda(bool deterministic);

}  // namespace circuitlab::engine
