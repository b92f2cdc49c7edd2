#include "server/engine/api.h"

#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <exception>

#include "server/common/thread_cancel.h"
#include "server/engine/analysis/registry.h"
#include "server/engine/families/family.h"
#include "server/engine/torch_compat.h"
#include "server/engine/train/run_loop.h"

namespace circuitlab::engine {
namespace {

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

  // The run's family trains it (families/family.h) through the run loop.
  absl::StatusOr<std::vector<TrainOutcome>> TrainImpl(const std::vector<TrainRequest>& requests,
                                                      const std::vector<TrainObserver*>& observers) {
    const TrainRequest& request = requests.front();
    at::set_num_threads(std::max(1, request.intra_op_threads));
    const torch::Device device(request.device);
    if (device.is_cuda() && device.index() >= CudaDeviceCount()) {
      return absl::FailedPreconditionError("device " + request.device + " is not available");
    }
    absl::StatusOr<std::vector<v1::ExperimentSpec>> members = PackMembers(requests);
    if (!members.ok()) return members.status();
    const ModelFamily& family = FamilyOf(request.spec);
    std::unique_ptr<TrainerBase> trainer = family.MakeTrainer(*std::move(members), device);
    std::unique_ptr<StepRecorder> recorder = family.MakeRecorder(request.spec, *trainer);
    return TrainMembers(requests, observers, *trainer, recorder.get());
  }
};

// Every analysis is looked up in the analysis table (analysis/registry.h)
// by the run's model family and the request's type, and runs inside
// Guarded: LibTorch's exceptions and a cancelled forward become statuses.
class TorchAnalyzer : public Analyzer {
 public:
  absl::Status Analyze(const AnalysisInput& input, const google::protobuf::Message& request,
                       google::protobuf::Message* response, const Progress& progress,
                       const CancelToken* cancel) override {
    const ModelFamily& family = FamilyOf(input.spec);
    const std::string name = AnalysisName(request.GetDescriptor());
    const AnalysisFn* fn = FindAnalysis(family.name(), request.GetDescriptor());
    if (fn == nullptr) return family.Lacks(name);
    if (response->GetDescriptor()->name() != name + "Response") {
      return absl::InternalError(name + " answered with " + response->GetDescriptor()->name());
    }
    return Guarded(name, [&] { return (*fn)(input, request, response, progress, cancel); });
  }
  std::vector<std::string> EvalSets(const v1::ExperimentSpec& resolved) override {
    std::vector<std::string> sets;
    for (const std::string& m : FamilyOf(resolved).EvalMetricNames(resolved)) {
      const size_t slash = m.find('/', 5);
      if (m.rfind("eval/", 0) != 0 || slash == std::string::npos) continue;
      std::string set = m.substr(5, slash - 5);
      if (std::find(sets.begin(), sets.end(), set) == sets.end()) sets.push_back(std::move(set));
    }
    return sets;
  }

 private:
  // LibTorch reports failures by throwing; analyses turn them into statuses.
  template <typename F>
  static auto Guarded(const std::string& what, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const ThreadCancelled&) {
      return absl::CancelledError(what + " cancelled");
    } catch (const c10::Error& e) {
      return absl::InternalError(what + ": LibTorch error: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return absl::InternalError(what + " failed: " + e.what());
    }
  }
};

}  // namespace

std::unique_ptr<Executor> MakeTorchExecutor() { return std::make_unique<TorchExecutor>(); }

std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) {
  return FamilyOf(resolved).EvalMetricNames(resolved);
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
  SetBlasThreads(blas_threads);  // a decoder run that splits its batch sets 1 (batch_split.h)
  // Keep freed activation buffers in the heap instead of unmapping them and
  // faulting them back every step (measured in bench/RESULTS.md).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  at::set_num_threads(1);
}

}  // namespace circuitlab::engine
