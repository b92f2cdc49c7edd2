// The IMIR attention-only "disentangled block residual" model (SCIENCE.md
// B.1), with a leading ensemble dimension E: E independent members share
// every tensor op but no parameter. Engine-private (includes LibTorch).
//
//   X0[i]  = [onehot_V(tok_i) ; onehot_P(pid_i)]                  (d0 = V + P)
//   layer l, head h:  A = softmax_causal(X W_{l,h} X^T),  Y_h = A X
//   X_l    = [X_{l-1} | Y_1 | ... | Y_H]                         (d_l = (H+1) d_{l-1})
//   logits = W_out x_L[T-1]                                      (W_out: V x d_L)
//
// Two parameterisations:
//   FULL         the merged key-query matrices W_{l,h} and W_out are dense
//                trainable tensors.
//   COORDINATES  W = sum_i c_i s_i B_i over chosen elements B_i of a basis
//                (s_i = 1/||B_i||_F for unit-norm scaling, else 1); only the
//                coefficients c [E, K] train. The dense matrices are
//                materialised by one gather per step. When at most half of
//                the key-query block pairs carry a coordinate (a ticket, a
//                circuit) the forward is block-sparse: scores are assembled
//                per (query block, key block) pair that carries one, heads
//                whose output nothing reads are skipped, and only residual
//                blocks that a later layer or the readout reads are
//                computed; otherwise the dense forward runs on the
//                materialised matrices.
// Value/output maps are fixed copies, so block pi of X_l holds what the path
// pi copied (see B.1 for the path/offset convention: the block written by
// head h of layer l sits at offset h * d_{l-1}).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "server/engine/basis/basis.h"
#include "server/engine/models/hooks.h"

namespace circuitlab::engine {

// The COORDINATES parameterisation's choices.
struct CoordinateConfig {
  Basis basis;                   // the model's basis (BuildBasis for the task)
  std::vector<int32_t> trained;  // indices into basis.coords, ascending
  bool unit_norm = true;         // s_i = 1/||B_i||_F, else 1
  // Forward: chosen by how many block pairs carry a coordinate, or forced
  // (tests compare the two).
  enum class Forward { kAuto, kSparse, kDense } forward = Forward::kAuto;
};

struct ImirModelConfig {
  int64_t vocab = 0;      // V: token vocabulary, also the output vocabulary
  int64_t positions = 0;  // P: position vocabulary
  int64_t layers = 2;
  int64_t heads = 1;
  bool zero_init = false;
  double init_std = 0.01;
  bool float64 = false;  // float32 for training; float64 for invariance checks (SCIENCE.md 0.3)
  // The ATen reference forward even where the hand-written block kernel
  // (imir_block.h) applies: tests compare the two.
  bool reference_forward = false;
  std::shared_ptr<const CoordinateConfig> coordinates;  // null = FULL
};

// A FULL model's configuration.
inline ImirModelConfig DenseConfig(int64_t vocab, int64_t positions, int64_t layers, int64_t heads,
                                   bool zero_init = false, double init_std = 0.01) {
  ImirModelConfig c;
  c.vocab = vocab;
  c.positions = positions;
  c.layers = layers;
  c.heads = heads;
  c.zero_init = zero_init;
  c.init_std = init_std;
  return c;
}

class ImirModel {
 public:
  ImirModel(const ImirModelConfig& config, int64_t ensemble, torch::Device device);

  // Member e's weights drawn from a generator seeded with init_seeds[e]
  // (i.i.d. N(0, init_std^2) entries, or per coefficient for COORDINATES, or
  // zeros). Gives member e exactly the weights an ensemble of one seeded with
  // init_seeds[e] gets.
  void Initialize(const std::vector<uint64_t>& init_seeds);

  // tokens, pids: [E, B, T] int64. Returns logits [E, B, V] at the last
  // position, or [E, B, T, V] at every position when all_positions is set.
  // On the CPU, the last position alone without hooks or attention rows runs
  // the hand-written block kernel (imir_block.h) on the dense matrices.
  // With `attention`, also the last position's attention row of every layer
  // (the hook L{l}.attn at the query): attention[l] is [E, H, B, T] (the
  // dense forward runs). `hook`, when given, is called at every hook point
  // in forward order (the dense forward runs, every layer at every
  // position), layers and heads from 1 as in the coordinate labels:
  //   embed          [E, B, T, d0]       X_0
  //   L{l}.attn      [E, H, B, T, T]     attention probabilities
  //   L{l}.H{h}.out  [E, B, T, d_{l-1}]  Y_h, what head h copies
  //   L{l}.resid     [E, B, T, d_l]      X_l, every block
  //   logits         [E, B, T, V]
  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& pids, bool all_positions = false,
                        std::vector<torch::Tensor>* attention = nullptr, const HookFn* hook = nullptr) const;

  // The dense matrices: kq(l): [E, H, d_l, d_l] with d_l = (H+1)^l d0;
  // readout: [E, V, d_L]. FULL: the parameters themselves (writable views);
  // COORDINATES: materialised from the coefficients (differentiable in grad
  // mode; writing to them changes nothing: use AssignDense).
  torch::Tensor kq(int64_t layer) const;
  torch::Tensor readout() const;
  // Sets member `member` to the given dense weights (shapes of one member):
  // FULL copies them; COORDINATES sets each trained coefficient to the
  // projection of the weights onto its element.
  void AssignDense(int64_t member, const std::vector<torch::Tensor>& kq, const torch::Tensor& readout);
  // COORDINATES: sets the coefficient of basis element `basis_index` (a
  // trained one) of member `member` from a raw coefficient (the value that
  // multiplies the 0/1 element). No-op for FULL.
  void SetRawCoordinate(int64_t member, int32_t basis_index, double raw);

  std::vector<torch::Tensor> parameters() const;
  // Parameter names in the order of parameters(): "L1.kq", ..., "out"; or
  // "coords" for COORDINATES.
  std::vector<std::string> parameter_names() const;

  bool coordinate_model() const { return cfg_.coordinates != nullptr; }
  bool sparse_forward() const { return coordinate_model() && sparse_; }
  int64_t d0() const { return cfg_.vocab + cfg_.positions; }
  int64_t width(int64_t layer) const;  // d_layer
  int64_t ensemble() const { return ensemble_; }
  const ImirModelConfig& config() const { return cfg_; }

 private:
  torch::Tensor Embed(const torch::Tensor& tokens, const torch::Tensor& pids) const;
  torch::Tensor DenseForward(const torch::Tensor& tokens, const torch::Tensor& pids, bool all_positions,
                             const std::vector<torch::Tensor>& kq, const torch::Tensor& readout,
                             std::vector<torch::Tensor>* attention = nullptr, const HookFn* hook = nullptr) const;
  torch::Tensor SparseForward(const torch::Tensor& tokens, const torch::Tensor& pids, bool all_positions) const;
  torch::Tensor ScaledValues() const;  // [E, K + 1]: s_i c_i, then a zero
  void PlanCoordinates();
  // PlanCoordinates' parts: the sparse forward's choice and per-pair gathers
  // (n: residual blocks after the last layer); which blocks and heads the
  // readout depends on, from the top.
  void PlanSparse(int64_t n);
  void PlanDependencies(const std::vector<bool>& readout_active);

  ImirModelConfig cfg_;
  int64_t ensemble_;
  torch::Device device_;
  // FULL
  std::vector<torch::Tensor> kq_;
  torch::Tensor readout_;
  // COORDINATES
  torch::Tensor coef_;                      // [E, K] trainable
  torch::Tensor scale_;                     // [K]
  std::vector<int32_t> position_of_;        // basis index -> position in coef_, or -1
  std::vector<torch::Tensor> kq_gather_;    // per layer [H * d * d] indices into ScaledValues()
  torch::Tensor readout_gather_;            // [V * d_L]
  // Sparse plan: per layer l (0-based), per head, the (query block, key block)
  // pairs carrying a trained coordinate; which heads and residual blocks are
  // needed; which readout blocks carry one.
  std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>> active_pairs_;
  std::vector<std::vector<bool>> head_needed_;
  std::vector<std::vector<bool>> block_needed_;  // per residual depth 0..L
  std::vector<int64_t> readout_blocks_;
  std::vector<std::vector<std::vector<torch::Tensor>>> pair_gather_;  // [l][h][pair] -> [d0 * d0]
  std::vector<torch::Tensor> readout_block_gather_;                      // per readout_blocks_ entry -> [V * d0]
  bool sparse_ = true;  // block-sparse forward (few active pairs) or dense on materialised matrices
};

}  // namespace circuitlab::engine
