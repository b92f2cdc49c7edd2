// Projection of IMIR model weights onto a basis (SCIENCE.md C.4), in
// float64. Engine-private (includes LibTorch).
//
// Within a block the basis elements are disjoint 0/1 parts, so the
// least-squares coefficient of part p is the mean of the block's entries over
// p, the on-manifold norm is sum_p size_p * mean_p^2, and the off-manifold
// residual rho = ||W - W_S|| / ||W|| follows without materialising W_S.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "server/engine/manifold/basis.h"
#include "server/engine/models/imir_model.h"

namespace circuitlab::engine {

struct MatrixNorms {
  std::string matrix;     // "L1H1", ..., "OUT"
  double total_sq = 0;    // ||W||^2
  double on_sq = 0;       // ||W_S||^2
  double rho() const;     // ||W - W_S|| / ||W|| (0 for a zero matrix)
};

struct Projection {
  std::vector<double> values;  // raw coefficient per Basis::coords entry
  std::vector<MatrixNorms> matrices;
  double rho() const;          // model level: over all matrices
};

// Projects models onto one basis; builds the basis' index tensors once.
class Projector {
 public:
  explicit Projector(const Basis& basis);
  const Basis& basis() const { return basis_; }

  // Projects ensemble member `member` of `model`.
  Projection Project(const ImirModel& model, int64_t member) const;
  // Projects matrices shaped like one member's weights (e.g. gradients):
  // kq[l] is [H, d_l, d_l], readout [V, d_L]; any floating dtype, any device.
  Projection ProjectTensors(const std::vector<torch::Tensor>& kq, const torch::Tensor& readout) const;
  // Overwrites member `member` of `target` with the on-manifold part W_S of
  // `projection` (a model of the same shape).
  void LoadProjected(const Projection& projection, ImirModel& target, int64_t member) const;

 private:
  Basis basis_;
  torch::Tensor kq_index_, readout_index_;  // part per block entry, for LoadProjected
};

// One-off conveniences (build a Projector each call).
Projection Project(const ImirModel& model, int64_t member, const Basis& basis);
void LoadProjected(const Basis& basis, const Projection& projection, ImirModel& target, int64_t member);

}  // namespace circuitlab::engine
