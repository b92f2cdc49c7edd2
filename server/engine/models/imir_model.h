// The IMIR attention-only "disentangled block residual" model (SCIENCE.md
// B.1), with a leading ensemble dimension E: E independent members share
// every tensor op but no parameter. Engine-private (includes LibTorch).
//
//   X0[i]  = [onehot_V(tok_i) ; onehot_P(pid_i)]                  (d0 = V + P)
//   layer l, head h:  A = softmax_causal(X W_{l,h} X^T),  Y_h = A X
//   X_l    = [X_{l-1} | Y_1 | ... | Y_H]                         (d_l = (H+1) d_{l-1})
//   logits = W_out x_L[T-1]                                      (W_out: V x d_L)
//
// Trainable: the merged key-query matrices W_{l,h} and W_out (FULL
// parameterisation). Value/output maps are fixed copies, so block pi of X_l
// holds what the path pi copied (see B.1 for the path/offset convention:
// the block written by head h of layer l sits at offset h * d_{l-1}).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace circuitlab::engine {

struct ImirModelConfig {
  int64_t vocab = 0;      // V: token vocabulary, also the output vocabulary
  int64_t positions = 0;  // P: position vocabulary
  int64_t layers = 2;
  int64_t heads = 1;
  bool zero_init = false;
  double init_std = 0.01;
  bool float64 = false;  // float32 for training; float64 for invariance checks (SCIENCE.md 0.3)
};

class ImirModel {
 public:
  ImirModel(const ImirModelConfig& config, int64_t ensemble, torch::Device device);

  // Member e's weights drawn from a generator seeded with init_seeds[e]
  // (i.i.d. N(0, init_std^2), or zeros). Gives member e exactly the weights an
  // ensemble of one seeded with init_seeds[e] gets.
  void Initialize(const std::vector<uint64_t>& init_seeds);

  // tokens, pids: [E, B, T] int64. Returns logits [E, B, V] at the last
  // position, or [E, B, T, V] at every position when all_positions is set.
  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& pids, bool all_positions = false) const;

  // kq(l): [E, H, d_l, d_l] with d_l = (H+1)^l d0; readout: [E, V, d_L].
  const torch::Tensor& kq(int64_t layer) const { return kq_[layer]; }
  const torch::Tensor& readout() const { return readout_; }
  std::vector<torch::Tensor> parameters() const;
  // Parameter names in the order of parameters(): "L1.kq", ..., "out".
  std::vector<std::string> parameter_names() const;

  int64_t d0() const { return cfg_.vocab + cfg_.positions; }
  int64_t width(int64_t layer) const;  // d_layer
  int64_t ensemble() const { return ensemble_; }
  const ImirModelConfig& config() const { return cfg_; }

 private:
  torch::Tensor Embed(const torch::Tensor& tokens, const torch::Tensor& pids) const;

  ImirModelConfig cfg_;
  int64_t ensemble_;
  torch::Device device_;
  std::vector<torch::Tensor> kq_;
  torch::Tensor readout_;
};

}  // namespace circuitlab::engine
