// Small LibTorch helpers every part of the engine uses: the tensor options of
// its double and index tensors and its CPU generators. One definition here
// (the engine compiles as unity batches, where file-local copies would
// collide). Engine-private (includes LibTorch).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>

#include <cstdint>
#include <vector>

namespace circuitlab::engine {

inline const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kDouble);
inline const torch::TensorOptions kI64 = torch::TensorOptions().dtype(torch::kLong);

// OpenBLAS's thread count, when it is the BLAS behind libblas.so.3 (it reads
// OPENBLAS_NUM_THREADS when it loads, before main()); process-wide.
inline void SetBlasThreads(int n) {
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(std::max(1, n));
}

// A CPU generator seeded with `seed`.
inline torch::Generator MakeGenerator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Training batches are drawn on the CPU (counter-based generators, a
// prefetch thread). For a CUDA device they pass through page-locked memory,
// so that the transfer is asynchronous and overlaps the step's kernels
// (LibTorch's caching host allocator keeps a buffer until its copy has run):
// PinFor on the prefetch thread, Upload on the training thread. On the CPU
// both return their argument.
inline torch::Tensor PinFor(const torch::Tensor& host, torch::Device device) {
  return device.is_cuda() ? host.pin_memory() : host;
}
inline torch::Tensor Upload(const torch::Tensor& host, torch::Device device) {
  return device.is_cuda() ? host.to(device, host.scalar_type(), /*non_blocking=*/true) : host;
}
// `parts` stacked along a new first dimension, on `device`: one part is a
// view (no copy) on the CPU; on a CUDA device they are stacked into a pinned
// buffer and uploaded asynchronously.
inline torch::Tensor StackTo(const std::vector<torch::Tensor>& parts, torch::Device device) {
  if (!device.is_cuda()) return parts.size() == 1 ? parts[0].unsqueeze(0) : torch::stack(parts);
  std::vector<int64_t> shape = parts[0].sizes().vec();
  shape.insert(shape.begin(), static_cast<int64_t>(parts.size()));
  torch::Tensor host = torch::empty(shape, parts[0].options().pinned_memory(true));
  torch::stack_out(host, parts);
  return Upload(host, device);
}

}  // namespace circuitlab::engine
