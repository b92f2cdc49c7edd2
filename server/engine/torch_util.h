// Small LibTorch helpers every part of the engine uses: the tensor options of
// its double and index tensors and its CPU generators. One definition here
// (the engine compiles as unity batches, where file-local copies would
// collide). Engine-private (includes LibTorch).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>

namespace circuitlab::engine {

inline const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kDouble);
inline const torch::TensorOptions kI64 = torch::TensorOptions().dtype(torch::kLong);

// A CPU generator seeded with `seed`.
inline torch::Generator MakeGenerator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

}  // namespace circuitlab::engine
