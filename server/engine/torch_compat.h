// The one place where the engine's code differs between the LibTorch
// releases it builds against: 1.13 (Debian 12) and 2.x (Debian 13, and every
// CUDA LibTorch: pytorch.org's archives, Debian's libtorch-cuda, a pip/conda
// torch's bundled one). Everything else compiles unchanged on both; a new
// difference gets a helper here, never a version check at its call site.
// Engine-private (includes LibTorch).
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <string>

namespace circuitlab::engine {

// "1.13.1", "2.6.0": the LibTorch this binary was compiled against.
inline std::string TorchVersion() { return TORCH_VERSION; }

#if TORCH_VERSION_MAJOR >= 2
// 2.x keys the optimiser's per-parameter state by the TensorImpl pointer.
using OptimizerStateKey = void*;
inline OptimizerStateKey StateKeyOf(const torch::Tensor& param) { return param.unsafeGetTensorImpl(); }
#else
// 1.13 keys it by the pointer printed as a string (c10::guts::to_string, gone in 2.x).
using OptimizerStateKey = std::string;
inline OptimizerStateKey StateKeyOf(const torch::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}
#endif

// Deterministic mode in 2.1+ also fills every new tensor with NaN (to expose
// reads of uninitialised memory); the engine never reads such memory, so the
// fill would only cost time. 1.13 has no such fill.
inline void KeepUninitializedMemoryUnfilled() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  at::globalContext().setDeterministicFillUninitializedMemory(false);
#endif
}

}  // namespace circuitlab::engine
