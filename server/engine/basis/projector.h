// Projection of IMIR weight matrices onto a basis (SCIENCE.md C.4), in
// float64, on tensors only: the models' floor uses it (a COORDINATES model
// assigns dense weights through it) and manifold/projection.h applies it to
// whole models. Engine-private (includes LibTorch).
//
// Within a block the basis elements are disjoint 0/1 parts, so the
// least-squares coefficient of part p is the mean of the block's entries over
// p, the on-manifold norm is sum_p size_p * mean_p^2, and the off-manifold
// residual rho = ||W - W_S|| / ||W|| follows without materialising W_S.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "server/engine/basis/basis.h"

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

// The on-manifold part W_S of a projection, as dense matrices of one member:
// kq[l] is [H, d_l, d_l], readout [V, d_L] (float64).
struct DenseWeights {
  std::vector<torch::Tensor> kq;
  torch::Tensor readout;
};

// Projects weights onto one basis; builds the basis' index tensors once.
class Projector {
 public:
  explicit Projector(const Basis& basis);
  const Basis& basis() const { return basis_; }

  // Projects matrices shaped like one member's weights (e.g. gradients):
  // kq[l] is [H, d_l, d_l], readout [V, d_L]; any floating dtype, any device.
  Projection ProjectTensors(const std::vector<torch::Tensor>& kq, const torch::Tensor& readout) const;
  // The on-manifold part W_S of `projection`, for a model of `layers` layers
  // of `heads` heads, one-hot width `d0` and `vocab` outputs.
  DenseWeights OnManifold(const Projection& projection, int64_t layers, int64_t heads, int64_t d0,
                          int64_t vocab) const;

 private:
  Basis basis_;
  torch::Tensor kq_index_, readout_index_;  // part per block entry, for OnManifold
};

}  // namespace circuitlab::engine
