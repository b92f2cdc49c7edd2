// Numerical check of Theorem 1 (SCIENCE.md C.6, E.2 as corrected by G.5): at
// a point of the span S, the expected gradient of the loss lies in S.
// Engine-private (includes LibTorch).
//
// The model is float64, placed at a point of S (raw coordinates i.i.d.
// N(0, s^2), optionally pushed off S by relative noise: control (a)). The
// expected gradient is estimated over N fresh sequences for a nested ladder of
// N (one pass: the gradient sum is snapshotted at each N); the off-span
// fraction 1 - f_N = 1 - ||P_S g||^2 / ||g||^2 is reported overall and per
// matrix, with a fit of 1 - f_N = a/N + b (b: the extrapolated plateau) and
// the log-log slope, both over the points with 1 - f_N <= 0.1 (Monte-Carlo
// noise alone gives slope -1 and plateau 0).
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "server/engine/api.h"
#include "server/engine/basis/basis.h"
#include "server/engine/tasks/block_task.h"

namespace circuitlab::engine {

struct InvarianceConfig {
  int64_t layers = 2, heads = 1;
  std::vector<int64_t> sample_sizes = {256, 1024, 4096, 16384, 65536};  // ascending
  int64_t chunk = 1024;
  double coordinate_std = 1.0;      // s
  double off_manifold_noise = 0.0;  // relative Frobenius norm of noise added to the point
  uint64_t seed = 1;
};

// One ladder of the check for one matrix ("all" first, then each matrix).
struct InvarianceSeries {
  std::string matrix;                // "all", "L1H1", ..., "OUT"
  std::vector<double> off_fraction;  // 1 - f_N per sample size
  double plateau = 0;                // fitted over points with 1 - f_N <= 0.1
  double slope = 0;                  // over the same points; NaN if fewer than 2
};

// One check's ladders and the sample sizes.
struct InvarianceResult {
  std::vector<InvarianceSeries> series;  // "all" first
  std::vector<int64_t> sample_sizes;
  double max_matrix_plateau() const {
    double m = 0;
    for (size_t i = 1; i < series.size(); ++i) m = std::max(m, series[i].plateau);
    return m;
  }
};

// `point_basis` places the point; `check_basis` is the span tested (usually
// the same). `progress(done, total)` is called after each chunk; returning
// false stops the check (the result is then partial).
InvarianceResult CheckInvariance(const BlockTask& task, const Basis& point_basis, const Basis& check_basis,
                                 const InvarianceConfig& config,
                                 const std::function<bool(int64_t, int64_t)>& progress = {});

// C.6 item 7 (the SGD corollary): plain SGD from a point of the span; the
// off-span residual rho only accumulates minibatch noise, so it shrinks ~2x
// when the batch grows 4x. The symmetrised variant averages each minibatch
// gradient over `group_elements` random elements of the task's symmetry
// group (tokens relabelled within their classes, keeping the relation;
// position ids shifted cyclically when the group has shifts), which removes
// most of the remaining off-span noise.
struct SgdCorollaryConfig {
  int64_t layers = 2, heads = 1;
  std::vector<int64_t> batch_sizes = {64, 256, 1024};
  int64_t steps = 20;
  double learning_rate = 0.5;
  double coordinate_std = 1.0;
  int64_t group_elements = 8;
  uint64_t seed = 1;
};

// One batch size: rho after the plain and the symmetrised SGD steps.
struct SgdCorollaryPoint {
  int64_t batch_size = 0;
  double rho = 0;              // off-span residual after the plain SGD steps
  double rho_symmetrised = 0;  // the same with symmetrised minibatch gradients
};

// `progress(done, total)` after each step; returning false stops.
std::vector<SgdCorollaryPoint> SgdCorollary(const BlockTask& task, const Basis& basis, const SgdCorollaryConfig& config,
                                            const std::function<bool(int64_t, int64_t)>& progress = {});

// One random element of the symmetry group applied to a whole batch.
Batch ApplyRandomSymmetry(const Batch& batch, const TaskSymmetry& symmetry, torch::Generator& gen);

}  // namespace circuitlab::engine
