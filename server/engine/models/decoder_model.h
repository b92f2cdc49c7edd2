// The standard decoder-only transformer of the task-vector paper (SCIENCE.md
// B.2) and its GPT-2-style regression variant (B.3), with an ensemble
// dimension and named hook points (D.6). Engine-private (includes LibTorch).
//
// Every parameter has a leading ensemble dimension E; member e is an
// independent model (the ensemble shares tensor ops, not weights). Inputs
// are tokens [E, B, T] (int64), or for the regression model continuous
// vectors [E, B, T, input_dim] (floating point, see MapstoInputs); outputs
// come back as [E, B, T, V] (V = 1 for the regression model's scalar).
//
// Hook points, layers from 0:
//   embed               [E, B, T, D]   token embedding / read-in (the stream entering L0)
//   L{l}.resid_pre      [E, B, T, D]   the stream entering block l
//   L{l}.attn.pattern   [E, B, H, T, T] attention probabilities
//   L{l}.attn.head      [E, B, T, H, d_head] head outputs before W_O
//   L{l}.post_attn      [E, B, T, D]   the stream after the attention sub-block
//   L{l}.post_mlp       [E, B, T, D]   the stream after the whole block
//   final_ln            [E, B, T, D]   the final LayerNorm's output (models with one)
//   logits              [E, B, T, V]   the output (the scalar prediction for regression)
// A hook sees the tensor at its point and may return a replacement of the
// same shape (or an undefined tensor to keep it).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "circuitlab/v1/spec.pb.h"
#include "server/engine/models/hooks.h"

namespace circuitlab::engine {

struct DecoderConfig {
  // vocab: the output width (and the token vocabulary when input_dim is 0).
  int64_t vocab = 0, d_model = 48, heads = 2, mlp = 192, layers = 2, max_len = 64;
  // > 0: continuous inputs of this width through a bias-free read-in, a
  // learnable pad vector, and a bias-free output map (B.3).
  int64_t input_dim = 0;
  bool gelu = false, attn_bias = false, final_ln = false;
  double init_std = 0.02, rope_base = 10000.0;
  // PyTorch's module defaults instead of N(0, init_std^2) (DECODER_INIT_TORCH_DEFAULT).
  bool torch_default_init = false;
};

DecoderConfig DecoderConfigOf(const v1::ExperimentSpec& resolved);

// A parsed hook name.
struct HookPoint {
  enum class Kind { kEmbed, kResidPre, kPattern, kHead, kPostAttn, kPostMlp, kFinalLn, kLogits } kind = Kind::kEmbed;
  int layer = -1;
  std::string name() const;
};
// InvalidArgument naming the allowed points when `name` is not one of this
// model's (`final_ln` exists when the model has a final LayerNorm).
absl::StatusOr<HookPoint> ParseHookPoint(const std::string& name, int64_t layers, bool final_ln = false);

class DecoderModel {
 public:
  DecoderModel(const DecoderConfig& cfg, int64_t ensemble, torch::Device device);

  // Member e from DeriveSeed-style seeds: N(0, init_std^2) matrices and
  // embedding, zero biases, unit LayerNorm gains; or, with
  // torch_default_init, what PyTorch's modules start at (an embedding and
  // the pad N(0, 1), a linear map's weight and bias U(+-1/sqrt(fan_in)),
  // LayerNorm 1 and 0).
  void Initialize(const std::vector<uint64_t>& init_seeds);

  // `hook`, when given, is called at every point in forward order. `upto`,
  // when >= 0, stops after block `upto` (no logits; returns the stream).
  torch::Tensor Forward(const torch::Tensor& tokens, const HookFn* hook = nullptr, int upto = -1) const;

  // The "mapsto" layout of SCIENCE.md A.2 (E2) for x [E, B, n, d] and y
  // [E, B, n]: x_1 |- y_1 x_2 |- y_2 ..., [E, B, 3n, d + 1], with [x; 0],
  // the learnable pad |- and [0_d; y] (differentiable in the pad). The
  // prediction of y_i is the output at position 3i + 1 (PredictionPosition).
  torch::Tensor MapstoInputs(const torch::Tensor& x, const torch::Tensor& y) const;
  static int64_t PredictionPosition(int64_t point) { return 3 * point + 1; }
  // The outputs [E, B, 3n, 1] at the prediction positions, [E, B, n].
  static torch::Tensor Predictions(const torch::Tensor& outputs);

  std::vector<torch::Tensor> parameters() const { return params_; }
  std::vector<std::string> parameter_names() const { return names_; }
  const DecoderConfig& config() const { return cfg_; }
  int64_t ensemble() const { return ensemble_; }

 private:
  struct Block {
    torch::Tensor ln1_w, ln1_b, wq, wk, wv, wo, bq, bk, bv, bo, ln2_w, ln2_b, w1, b1, w2, b2;
  };
  torch::Tensor& Add(const std::string& name, torch::Tensor t);
  torch::Tensor Rope(const torch::Tensor& x) const;  // x [E, B, H, T, dh]
  // Block b's attention heads on h [E, B, T, D] (the first LayerNorm's
  // output), side by side [E, B, T, D] before W_O; `fused`: CausalAttention.
  torch::Tensor Attention(const Block& b, const torch::Tensor& h, const HookFn* hook, const std::string& prefix,
                          bool fused) const;

  DecoderConfig cfg_;
  int64_t ensemble_;
  torch::Device device_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  torch::Tensor embed_, pad_, lnf_w_, lnf_b_, head_w_, head_b_;
  std::vector<Block> blocks_;
  torch::Tensor cos_, sin_;  // [max_len, dh/2]
};

}  // namespace circuitlab::engine
