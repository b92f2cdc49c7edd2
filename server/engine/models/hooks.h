// Named hook points (SCIENCE.md D.6), shared by every model with them: a
// hook sees the tensor at a point and may return a replacement of the same
// shape (or an undefined tensor to keep it). Engine-private (LibTorch).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

namespace circuitlab::engine {

using HookFn = std::function<torch::Tensor(const std::string& point, const torch::Tensor& value)>;

// Calls `hook` (when given) at `point`; its replacement, or `x`.
inline torch::Tensor ApplyHook(const HookFn* hook, const std::string& point, torch::Tensor x) {
  if (hook == nullptr) return x;
  torch::Tensor y = (*hook)(point, x);
  return y.defined() ? y : x;
}

}  // namespace circuitlab::engine
