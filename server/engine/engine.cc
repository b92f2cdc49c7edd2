#include "server/engine/engine.h"

#include <dlfcn.h>
#include <malloc.h>

#include <chrono>
#include <exception>

#include "server/engine/train/trainer.h"

namespace circuitlab::engine {
namespace {

constexpr double kProgressIntervalSeconds = 0.5;

class TorchExecutor : public Executor {
 public:
  absl::StatusOr<TrainOutcome> Train(const TrainRequest& request, TrainObserver& observer) override {
    // LibTorch reports failures by throwing; this is the one place they are
    // turned into a status.
    try {
      return TrainImpl(request, observer);
    } catch (const c10::Error& e) {
      return absl::InternalError(std::string("LibTorch error: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return absl::InternalError(std::string("training failed: ") + e.what());
    }
  }

 private:
  absl::StatusOr<TrainOutcome> TrainImpl(const TrainRequest& request, TrainObserver& observer) {
    at::set_num_threads(std::max(1, request.intra_op_threads));
    const torch::Device device(request.device);
    if (device.is_cuda() && device.index() >= CudaDeviceCount()) {
      return absl::FailedPreconditionError("device " + request.device + " is not available");
    }
    const v1::ExperimentSpec& spec = request.spec;
    EnsembleTrainer trainer(spec, {spec.seed()}, device);
    if (request.resume_from) {
      if (absl::Status s = trainer.LoadCheckpoint(*request.resume_from); !s.ok()) return s;
    } else {
      observer.OnMetrics(0, trainer.Evaluate()[0]);
    }

    const auto& rec = spec.recording();
    const int64_t total = trainer.total_steps();
    int64_t last_checkpoint = trainer.step();
    auto last_report = std::chrono::steady_clock::now();
    int64_t last_report_step = trainer.step();
    double rate = 0;

    auto checkpoint = [&]() -> absl::Status {
      last_checkpoint = trainer.step();
      return observer.OnCheckpoint(trainer.step(), trainer.SaveCheckpoint());
    };

    while (trainer.step() < total) {
      if (request.cancel != nullptr && request.cancel->stop_requested()) {
        if (request.cancel->reason() == StopReason::kPreempt) {
          if (trainer.step() != last_checkpoint) {
            if (absl::Status s = checkpoint(); !s.ok()) return s;
          }
          return TrainOutcome{TrainEnd::kPreempted, trainer.step()};
        }
        return TrainOutcome{TrainEnd::kCancelled, trainer.step()};
      }
      const int64_t next = trainer.step() + 1;
      const bool last = next == total;
      std::vector<std::vector<Metric>> metrics = trainer.Step(last || next % rec.metrics_every() == 0);
      std::vector<Metric> points = metrics.empty() ? std::vector<Metric>() : metrics[0];
      if (last || next % rec.eval_every() == 0) {
        auto eval = trainer.Evaluate();
        points.insert(points.end(), eval[0].begin(), eval[0].end());
      }
      if (!points.empty()) observer.OnMetrics(next, points);

      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last_report).count();
      if (dt >= kProgressIntervalSeconds || last) {
        rate = dt > 0 ? static_cast<double>(next - last_report_step) / dt : rate;
        observer.OnProgress(next, rate);
        last_report = now;
        last_report_step = next;
      }
      if (last || next % rec.checkpoint_every() == 0) {
        if (absl::Status s = checkpoint(); !s.ok()) return s;
      }
    }
    return TrainOutcome{TrainEnd::kCompleted, trainer.step()};
  }
};

}  // namespace

std::unique_ptr<Executor> MakeTorchExecutor() { return std::make_unique<TorchExecutor>(); }

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
