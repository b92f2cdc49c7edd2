#include "server/engine/engine.h"

#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <exception>

#include "server/common/thread_cancel.h"
#include "server/engine/analysis/circuits.h"
#include "server/engine/analysis/data_dependence.h"
#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/analysis/regression_vectors.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/manifold/invariance.h"
#include "server/engine/manifold/projection.h"
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

class TorchAnalyzer : public Analyzer {
 public:
  absl::StatusOr<CheckpointProjection> ProjectCheckpoint(const v1::ExperimentSpec& spec,
                                                         const std::string& checkpoint,
                                                         Selection selection) override {
    try {
      // The run's own task pool: its fixed pairing is the relation C.
      const std::unique_ptr<BlockTask> task = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
      const auto& m = spec.model().imir();
      const std::unique_ptr<ImirModel> model_ptr = MakeModel(spec, *task, 1, torch::kCPU);
      ImirModel& model = *model_ptr;
      if (absl::Status s = LoadWeights(checkpoint, model); !s.ok()) return s;
      const TaskSymmetry sym = task->Symmetry();
      CheckpointProjection out;
      out.basis = BuildBasis(sym, m.num_layers(), m.num_heads(), selection);
      const Projection p = Project(model, 0, out.basis);
      out.values = p.values;
      out.rho = p.rho();
      for (const MatrixNorms& n : p.matrices) out.rho_by_matrix.emplace_back(n.matrix, n.rho());
      out.rho_complete = selection == Selection::kComplete
                             ? out.rho
                             : Project(model, 0, BuildBasis(sym, m.num_layers(), m.num_heads(), Selection::kComplete))
                                   .rho();
      return out;
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(std::string("cannot read the checkpoint: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return absl::InternalError(std::string("projection failed: ") + e.what());
    }
  }

  absl::StatusOr<InvarianceReport> CheckInvariance(const v1::ExperimentSpec& spec, const InvarianceRequest& request,
                                                   const std::function<void(double)>& progress,
                                                   const CancelToken* cancel) override {
    try {
      at::set_num_threads(1);
      const std::unique_ptr<BlockTask> task_ptr = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
      const BlockTask& task = *task_ptr;
      const auto& m = spec.model().imir();
      const TaskSymmetry sym = task.Symmetry();
      const Basis span = BuildBasis(sym, m.num_layers(), m.num_heads(), request.selection);
      struct Check {
        std::string name;
        Basis basis;
        double noise;
      };
      std::vector<Check> checks = {{"in_span", span, 0.0}};
      if (request.controls) {
        checks.push_back({"control_off_span", span, 0.3});
        if (std::any_of(sym.partner.begin(), sym.partner.end(), [](int p) { return p >= 0; })) {
          TaskSymmetry without = sym;  // claims the fixed pairs are exchangeable
          std::fill(without.partner.begin(), without.partner.end(), -1);
          checks.push_back({"control_no_relation", BuildBasis(without, m.num_layers(), m.num_heads(),
                                                              request.selection), 0.0});
        }
      }
      InvarianceReport report;
      report.sample_sizes = request.sample_sizes;
      for (size_t i = 0; i < checks.size(); ++i) {
        InvarianceConfig ic;
        ic.layers = m.num_layers();
        ic.heads = m.num_heads();
        ic.sample_sizes = request.sample_sizes;
        ic.coordinate_std = request.coordinate_std;
        ic.off_manifold_noise = checks[i].noise;
        ic.seed = request.seed;
        bool stopped = false;
        // The free function (this member shares its name).
        InvarianceResult r = engine::CheckInvariance(task, checks[i].basis, checks[i].basis, ic,
                                                     [&](int64_t done, int64_t total) {
          if (progress) {
            const double stages = static_cast<double>(checks.size()) + (request.sgd_corollary ? 1.0 : 0.0);
            progress((static_cast<double>(i) + static_cast<double>(done) / total) / stages);
          }
          stopped = cancel != nullptr && cancel->stop_requested();
          return !stopped;
        });
        if (stopped) return absl::CancelledError("invariance check stopped");
        report.checks.push_back({checks[i].name, r.series});
      }
      if (request.sgd_corollary) {
        SgdCorollaryConfig sc;
        sc.layers = m.num_layers();
        sc.heads = m.num_heads();
        sc.coordinate_std = request.coordinate_std;
        sc.seed = request.seed;
        bool stopped = false;
        // The SGD corollary is one more stage after the ladders.
        const double stages = static_cast<double>(checks.size()) + 1.0;
        report.sgd = SgdCorollary(task, span, sc, [&](int64_t done, int64_t total) {
          if (progress) progress((stages - 1.0 + static_cast<double>(done) / total) / stages);
          stopped = cancel != nullptr && cancel->stop_requested();
          return !stopped;
        });
        if (stopped) return absl::CancelledError("invariance check stopped");
        report.sgd_steps = sc.steps;
        report.sgd_group_elements = sc.group_elements;
        report.sgd_learning_rate = sc.learning_rate;
      }
      return report;
    } catch (const c10::Error& e) {
      return absl::InternalError(std::string("LibTorch error: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return absl::InternalError(std::string("invariance check failed: ") + e.what());
    }
  }

  absl::StatusOr<DetectReport> DetectCircuit(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                             const DetectRequest& request, const std::function<void(double)>& progress,
                                             const CancelToken* cancel) override {
    return Guarded("circuit detection", [&] { return DetectCircuitImpl(spec, checkpoint, request, progress, cancel); });
  }

  absl::StatusOr<InterveneReport> Intervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                            const InterveneRequest& request) override {
    return Guarded("intervention", [&]() -> absl::StatusOr<InterveneReport> {
      if (spec.model().kind_case() != v1::ModelSpec::kDecoder) return InterveneImpl(spec, checkpoint, request);
      const std::unique_ptr<DecoderModel> model = MakeDecoder(spec, 1, torch::kCPU);
      if (absl::Status s = LoadWeights(checkpoint, model->parameter_names(), model->parameters()); !s.ok()) return s;
      if (spec.task().latent().kind() == v1::LATENT_KIND_REGRESSION) {
        const RegressionTaskGenerator task(spec.task().latent(), PoolSeedOf(spec.seed()));
        return InterveneRegression(*model, task, request);
      }
      const LatentTaskGenerator task(spec.task().latent(), PoolSeedOf(spec.seed()));
      return InterveneDecoder(*model, task, request);
    });
  }

  absl::StatusOr<std::vector<DataDependenceRow>> CheckDataDependence(
      const v1::ExperimentSpec& spec, const std::vector<DataDependencePoint>& points,
      const DataDependenceConfig& config, const std::function<void(double)>& progress,
      const CancelToken* cancel) override {
    return Guarded("data-dependence check", [&]() -> absl::StatusOr<std::vector<DataDependenceRow>> {
      at::set_num_threads(1);
      bool stopped = false;
      std::vector<DataDependenceRow> rows =
          engine::CheckDataDependence(spec, points, config, [&](int64_t done, int64_t total) {
            if (progress) progress(static_cast<double>(done) / static_cast<double>(std::max<int64_t>(1, total)));
            stopped = cancel != nullptr && cancel->stop_requested();
            return !stopped;
          });
      if (stopped) return absl::CancelledError("data-dependence check stopped");
      return rows;
    });
  }

  absl::StatusOr<TaskVectorReport> AnalyzeTaskVectors(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                      const TaskVectorRequest& request,
                                                      const std::function<void(double)>& progress,
                                                      const CancelToken* cancel) override {
    return Guarded("task-vector analysis", [&]() -> absl::StatusOr<TaskVectorReport> {
      if (!IsLatent(spec) || spec.model().kind_case() != v1::ModelSpec::kDecoder) {
        return absl::FailedPreconditionError("task-vector analyses need a run of task.latent on model.decoder");
      }
      at::set_num_threads(1);
      const int64_t layers = spec.model().decoder().num_layers();
      for (const std::string& kind :
           {request.hook, request.estimation_hook, request.injection_hook, request.dissociation_hook}) {
        if (absl::StatusOr<HookPoint> p = ParseHookPoint("L0." + kind, layers);
            !p.ok() || p->kind == HookPoint::Kind::kPattern || p->kind == HookPoint::Kind::kHead) {
          return absl::InvalidArgumentError("hook '" + kind + "' must be post_mlp, post_attn or resid_pre");
        }
      }
      for (int l : request.layers) {
        if (l < 0 || l >= layers) {
          return absl::InvalidArgumentError("layers must be in [0, " + std::to_string(layers - 1) + "], got " +
                                            std::to_string(l));
        }
      }
      const std::unique_ptr<DecoderModel> model = MakeDecoder(spec, 1, torch::kCPU);
      if (absl::Status s = LoadWeights(checkpoint, model->parameter_names(), model->parameters()); !s.ok()) return s;
      for (torch::Tensor& p : model->parameters()) p.requires_grad_(false);
      if (spec.task().latent().kind() == v1::LATENT_KIND_REGRESSION) {
        const RegressionTaskGenerator task(spec.task().latent(), PoolSeedOf(spec.seed()));
        return RunRegressionAnalyses(*model, task, request, progress, cancel);
      }
      const LatentTaskGenerator task(spec.task().latent(), PoolSeedOf(spec.seed()));
      return RunTaskVectorAnalyses(*model, task, request, progress, cancel);
    });
  }

  absl::StatusOr<LabelReport> LabelRun(const v1::ExperimentSpec& spec,
                                       const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                       const LabelRequest& request, const std::function<void(double)>& progress,
                                       const CancelToken* cancel) override {
    return Guarded("labelling", [&] { return LabelRunImpl(spec, checkpoints, request, progress, cancel); });
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

std::unique_ptr<Analyzer> MakeTorchAnalyzer() { return std::make_unique<TorchAnalyzer>(); }

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

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
