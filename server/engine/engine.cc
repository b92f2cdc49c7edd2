#include "server/engine/engine.h"

#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>

#include "server/common/thread_cancel.h"
#include "server/engine/analysis/family.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/torch_compat.h"
#include "server/engine/train/latent_trainer.h"
#include "server/engine/train/regression_trainer.h"
#include "server/engine/train/trainer.h"

namespace circuitlab::engine {
namespace {

constexpr double kProgressIntervalSeconds = 0.5;

// Projects the weights onto the paper and complete bases at recording steps:
// paper coordinates (and complete ones on request) go to OnCoordinates, the
// residuals rho to the metrics of the step.
class ManifoldRecorder {
 public:
  ManifoldRecorder(const EnsembleTrainer& trainer, bool store_complete)
      : paper_(BuildBasis(trainer.task(0).Symmetry(), trainer.model().config().layers,
                          trainer.model().config().heads, Selection::kPaper)),
        complete_(BuildBasis(trainer.task(0).Symmetry(), trainer.model().config().layers,
                             trainer.model().config().heads, Selection::kComplete)),
        store_complete_(store_complete) {}

  absl::Status Announce(TrainObserver& observer) const {
    if (absl::Status s = observer.OnBasis(paper_.basis()); !s.ok()) return s;
    return store_complete_ ? observer.OnBasis(complete_.basis()) : absl::OkStatus();
  }

  // Appends member `member`'s rho metrics of the step to `metrics`.
  void Record(int64_t step, const ImirModel& model, int64_t member, TrainObserver& observer,
              std::vector<Metric>& metrics) const {
    const Projection paper = paper_.Project(model, member);
    const Projection complete = complete_.Project(model, member);
    observer.OnCoordinates(step, Selection::kPaper, paper.values);
    if (store_complete_) observer.OnCoordinates(step, Selection::kComplete, complete.values);
    metrics.push_back({"manifold/rho", complete.rho()});
    metrics.push_back({"manifold/rho_paper", paper.rho()});
    for (const MatrixNorms& m : complete.matrices) metrics.push_back({"manifold/rho/" + m.matrix, m.rho()});
  }

 private:
  Projector paper_, complete_;
  bool store_complete_;
};

class TorchExecutor : public Executor {
 public:
  std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) override {
    return engine::EvalMetricNames(resolved);
  }
  absl::Status CheckCheckpoint(const v1::ExperimentSpec& spec, int64_t step, const std::string& bytes) override {
    return engine::CheckCheckpoint(spec, step, bytes);
  }
  absl::StatusOr<TrainOutcome> Train(const TrainRequest& request, TrainObserver& observer) override {
    std::vector<absl::StatusOr<TrainOutcome>> out = Guard({request}, {&observer});
    return out.front();
  }

  std::vector<absl::StatusOr<TrainOutcome>> TrainPack(const std::vector<TrainRequest>& requests,
                                                      const std::vector<TrainObserver*>& observers) override {
    return Guard(requests, observers);
  }

 private:
  // LibTorch reports failures by throwing; this is the one place they are
  // turned into a status (for every member).
  std::vector<absl::StatusOr<TrainOutcome>> Guard(const std::vector<TrainRequest>& requests,
                                                  const std::vector<TrainObserver*>& observers) {
    absl::Status failed;
    try {
      absl::StatusOr<std::vector<TrainOutcome>> out = TrainImpl(requests, observers);
      if (out.ok()) return {out->begin(), out->end()};
      failed = out.status();
    } catch (const c10::Error& e) {
      failed = absl::InternalError(std::string("LibTorch error: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      failed = absl::InternalError(std::string("training failed: ") + e.what());
    }
    return std::vector<absl::StatusOr<TrainOutcome>>(requests.size(), failed);
  }

  // One ensemble member per request (SCIENCE.md 0.3: member e trains as a
  // one-member run with its seed would).
  absl::StatusOr<std::vector<TrainOutcome>> TrainImpl(const std::vector<TrainRequest>& requests,
                                                      const std::vector<TrainObserver*>& observers) {
    const TrainRequest& request = requests.front();
    const size_t E = requests.size();
    at::set_num_threads(std::max(1, request.intra_op_threads));
    const torch::Device device(request.device);
    if (device.is_cuda() && device.index() >= CudaDeviceCount()) {
      return absl::FailedPreconditionError("device " + request.device + " is not available");
    }
    const v1::ExperimentSpec& spec = request.spec;
    std::vector<uint64_t> seeds;
    for (const TrainRequest& r : requests) {
      if (E > 1 && (r.resume_from || !PackableTogether(r.spec, spec))) {
        return absl::InvalidArgumentError("a pack holds fresh runs whose specs differ only in their seed");
      }
      seeds.push_back(r.spec.seed());
    }
    const auto& rec = spec.recording();
    std::unique_ptr<TrainerBase> trainer_ptr;
    const EnsembleTrainer* imir = nullptr;
    if (IsLatent(spec) && spec.task().latent().kind() == v1::LATENT_KIND_REGRESSION) {
      trainer_ptr = std::make_unique<RegressionTrainer>(spec, seeds, device);
    } else if (IsLatent(spec)) {
      trainer_ptr = std::make_unique<LatentTrainer>(spec, seeds, device);
    } else {
      auto t = std::make_unique<EnsembleTrainer>(spec, seeds, device);
      imir = t.get();
      trainer_ptr = std::move(t);
    }
    TrainerBase& trainer = *trainer_ptr;
    std::optional<ManifoldRecorder> manifold;
    if (imir != nullptr && rec.coordinates_every() > 0) {
      manifold.emplace(*imir, rec.complete_coordinates());
      for (TrainObserver* o : observers) {
        if (absl::Status s = manifold->Announce(*o); !s.ok()) return s;
      }
    }
    if (request.resume_from) {
      if (absl::Status s = trainer.LoadCheckpoint(*request.resume_from); !s.ok()) return s;
    } else {
      std::vector<std::vector<Metric>> initial = trainer.Evaluate();
      for (size_t e = 0; e < E; ++e) {
        if (manifold) manifold->Record(0, imir->model(), static_cast<int64_t>(e), *observers[e], initial[e]);
        observers[e]->OnMetrics(0, initial[e]);
      }
    }

    const int64_t total = trainer.total_steps();
    const std::string& stop_metric = spec.training().stop_metric();
    int64_t last_checkpoint = trainer.step();
    auto last_report = std::chrono::steady_clock::now();
    int64_t last_report_step = trainer.step();
    double rate = 0;
    std::vector<TrainOutcome> outcome(E);
    std::vector<bool> live(E, true);  // members still reporting (a cancelled member drops out)
    size_t live_count = E;

    auto save = [&](size_t e) -> absl::Status {
      const std::string bytes = E == 1 ? trainer.SaveCheckpoint() : trainer.SaveMemberCheckpoint(static_cast<int64_t>(e));
      return observers[e]->OnCheckpoint(trainer.step(), bytes);
    };
    auto finish = [&](TrainEnd end) {
      for (size_t e = 0; e < E; ++e) {
        if (live[e]) outcome[e] = TrainOutcome{end, trainer.step()};
      }
      return outcome;
    };

    while (trainer.step() < total) {
      for (size_t e = 0; e < E; ++e) {
        const CancelToken* cancel = requests[e].cancel;
        if (!live[e] || cancel == nullptr || !cancel->stop_requested()) continue;
        if (cancel->reason() == StopReason::kPreempt) {
          // A drain: every member checkpoints and goes back to the queue.
          if (trainer.step() != last_checkpoint) {
            for (size_t m = 0; m < E; ++m) {
              if (!live[m]) continue;
              if (absl::Status s = save(m); !s.ok()) return s;
            }
          }
          return finish(TrainEnd::kPreempted);
        }
        outcome[e] = TrainOutcome{TrainEnd::kCancelled, trainer.step()};
        live[e] = false;
        --live_count;
      }
      if (live_count == 0) return outcome;
      const int64_t next = trainer.step() + 1;
      const bool last = next == total;
      std::vector<bool> ends(E, last);  // a member's last step: the run's, or its early stop
      std::vector<std::vector<Metric>> points = trainer.Step(last || next % rec.metrics_every() == 0);
      points.resize(E);
      if (last || next % rec.eval_every() == 0) {
        std::vector<std::vector<Metric>> eval = trainer.Evaluate();
        for (size_t e = 0; e < E; ++e) {
          points[e].insert(points[e].end(), eval[e].begin(), eval[e].end());
          if (stop_metric.empty() || !live[e]) continue;
          const auto it = std::find_if(eval[e].begin(), eval[e].end(),
                                       [&](const Metric& m) { return m.name == stop_metric; });
          if (it == eval[e].end()) {
            std::string have;
            for (const Metric& m : eval[e]) have += (have.empty() ? "" : ", ") + m.name;
            return absl::InvalidArgumentError("training.stop_metric '" + stop_metric +
                                              "' is not an evaluation metric of this task (" + have + ")");
          }
          // Early stop: this step becomes the member's last (final records, checkpoint).
          ends[e] = ends[e] || it->value >= spec.training().stop_at();
        }
      }
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last_report).count();
      const bool report = dt >= kProgressIntervalSeconds || last;
      if (report) {
        rate = dt > 0 ? static_cast<double>(next - last_report_step) / dt : rate;
        last_report = now;
        last_report_step = next;
      }
      const bool checkpoint_step = next % rec.checkpoint_every() == 0;
      if (checkpoint_step || last) last_checkpoint = next;
      for (size_t e = 0; e < E; ++e) {
        if (!live[e]) continue;
        if (manifold && (ends[e] || next % rec.coordinates_every() == 0)) {
          manifold->Record(next, imir->model(), static_cast<int64_t>(e), *observers[e], points[e]);
        }
        if (!points[e].empty()) observers[e]->OnMetrics(next, points[e]);
        if (report || ends[e]) observers[e]->OnProgress(next, rate);
        if (checkpoint_step || ends[e]) {
          if (absl::Status s = save(e); !s.ok()) return s;
        }
        if (ends[e] && !last) {  // stopped early; the others go on
          outcome[e] = TrainOutcome{TrainEnd::kCompleted, next};
          live[e] = false;
          --live_count;
        }
      }
      if (last || live_count == 0) break;
    }
    return finish(TrainEnd::kCompleted);
  }
};

// Every analysis goes to the run's model family (analysis/family.h), inside
// Guarded: LibTorch's exceptions and a cancelled forward become statuses.
class TorchAnalyzer : public Analyzer {
 public:
  absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(
      const v1::ExperimentSpec& spec, const std::string& checkpoint,
      const v1::ProjectCheckpointRequest& request) override {
    return Guarded("projection", [&] { return FamilyOf(spec).ProjectCheckpoint(spec, checkpoint, request); });
  }
  absl::StatusOr<v1::CheckInvarianceResponse> CheckInvariance(const v1::ExperimentSpec& spec,
                                                              const v1::CheckInvarianceRequest& request,
                                                              const Progress& progress,
                                                              const CancelToken* cancel) override {
    return Guarded("invariance check", [&] { return FamilyOf(spec).CheckInvariance(spec, request, progress, cancel); });
  }
  absl::StatusOr<v1::DetectCircuitResponse> DetectCircuit(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                          const v1::DetectCircuitRequest& request,
                                                          const Progress& progress,
                                                          const CancelToken* cancel) override {
    return Guarded("circuit detection",
                   [&] { return FamilyOf(spec).DetectCircuit(spec, checkpoint, request, progress, cancel); });
  }
  absl::StatusOr<v1::InterveneResponse> Intervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                  const v1::InterveneRequest& request,
                                                  const std::map<int, StoredCheckpoint>& swap_sources) override {
    return Guarded("intervention", [&] { return FamilyOf(spec).Intervene(spec, checkpoint, request, swap_sources); });
  }
  absl::StatusOr<v1::CheckDataDependenceResponse> CheckDataDependence(const v1::ExperimentSpec& spec,
                                                                      const v1::CheckDataDependenceRequest& request,
                                                                      const Progress& progress,
                                                                      const CancelToken* cancel) override {
    return Guarded("data-dependence check",
                   [&] { return FamilyOf(spec).CheckDataDependence(spec, request, progress, cancel); });
  }
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> AnalyzeTaskVectors(const v1::ExperimentSpec& spec,
                                                                    const std::string& checkpoint,
                                                                    const v1::AnalyzeTaskVectorsRequest& request,
                                                                    const Progress& progress,
                                                                    const CancelToken* cancel) override {
    return Guarded("task-vector analysis",
                   [&] { return FamilyOf(spec).AnalyzeTaskVectors(spec, checkpoint, request, progress, cancel); });
  }
  absl::StatusOr<v1::LabelRunResponse> LabelRun(const v1::ExperimentSpec& spec,
                                                const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                                const v1::LabelRunRequest& request, const Progress& progress,
                                                const CancelToken* cancel) override {
    return Guarded("labelling", [&] { return FamilyOf(spec).LabelRun(spec, checkpoints, request, progress, cancel); });
  }

 private:
  // LibTorch reports failures by throwing; analyses turn them into statuses.
  template <typename F>
  static auto Guarded(const char* what, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const ThreadCancelled&) {
      return absl::CancelledError(std::string(what) + " cancelled");
    } catch (const c10::Error& e) {
      return absl::InternalError(std::string(what) + ": LibTorch error: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return absl::InternalError(std::string(what) + " failed: " + e.what());
    }
  }
};

}  // namespace

std::unique_ptr<Executor> MakeTorchExecutor() { return std::make_unique<TorchExecutor>(); }

std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& set, std::initializer_list<const char*> names) {
    for (const char* n : names) out.push_back("eval/" + set + "/" + n);
  };
  if (IsLatent(resolved)) {
    const bool regression = resolved.task().latent().kind() == v1::LATENT_KIND_REGRESSION;
    for (const LatentEvalSetDef& set : LatentEvalSets(resolved.task().latent().diversity() >= 0)) {
      if (regression) {
        add(set.name, {"loss", "bayes_loss", "retrieval_loss", "ridge_loss", "to_retrieval", "to_ridge"});
      } else {
        add(set.name, {"loss", "accuracy", "bayes_loss"});
      }
    }
    return out;
  }
  const std::unique_ptr<BlockTask> task = MakeBlockTask(resolved, PoolSeedOf(resolved.seed()));
  for (const EvalSetInfo& info : task->EvalSets()) {
    add(info.name, {"accuracy", "loss", "p_target", "bayes_loss", "bayes_accuracy"});
    if (info.mode == SampleMode::kConflict) add(info.name, {"p_icl", "p_iwl", "logit_diff"});
    if (!info.alt_name.empty()) out.push_back("eval/" + info.name + "/" + info.alt_name + "_accuracy");
  }
  return out;
}

std::unique_ptr<Analyzer> MakeTorchAnalyzer() { return std::make_unique<TorchAnalyzer>(); }

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

std::string TorchRuntime::Describe() const {
  if (cuda_runtime.empty()) return "LibTorch " + version + " (CPU only)";
  return "LibTorch " + version + " (CUDA " + cuda_runtime + "), " + std::to_string(cuda_devices) + " CUDA device" +
         (cuda_devices == 1 ? "" : "s");
}

namespace {

// Total memory of each CUDA device, read through the CUDA runtime that a CUDA
// LibTorch has loaded (looked up by name: this file compiles against CPU and
// CUDA LibTorch alike, without CUDA headers). Empty when there is none.
std::vector<uint64_t> CudaMemoryBytes(int devices) {
  using SetDevice = int (*)(int);
  using MemGetInfo = int (*)(size_t*, size_t*);
  auto* set = reinterpret_cast<SetDevice>(dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  auto* info = reinterpret_cast<MemGetInfo>(dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  std::vector<uint64_t> out;
  if (set == nullptr || info == nullptr) return out;
  for (int i = 0; i < devices; ++i) {
    size_t free = 0, total = 0;
    if (set(i) != 0 || info(&free, &total) != 0) return {};
    out.push_back(total);
  }
  if (devices > 0) set(0);
  return out;
}

}  // namespace

TorchRuntime DescribeTorchRuntime() {
  TorchRuntime r;
  r.version = TorchVersion();
  // hasCUDART: LibTorch's CUDA half is loaded (a CUDA build), whether or not
  // a driver or device is there; versionCUDART is the compile-time 12040.
  if (at::globalContext().hasCUDART()) {
    const long v = at::globalContext().versionCUDART();
    r.cuda_runtime = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  }
  r.cuda_devices = CudaDeviceCount();
  r.cuda_memory_bytes = CudaMemoryBytes(r.cuda_devices);
  return r;
}

void ConfigureCuda(bool deterministic) {
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(deterministic);
  at::globalContext().setDeterministicAlgorithms(deterministic, /*warn_only=*/true);
  if (deterministic) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    KeepUninitializedMemoryUnfilled();
  }
}

void ConfigureRuntime(int blas_threads) {
  // OpenBLAS reads OPENBLAS_NUM_THREADS when it loads, before main(); pin its
  // pool explicitly when it is the BLAS behind libblas.so.3.
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(std::max(1, blas_threads));
  }
  // Keep freed activation buffers in the heap instead of unmapping them and
  // faulting them back every step (measured in bench/RESULTS.md).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  at::set_num_threads(1);
}

}  // namespace circuitlab::engine
