// Data-dependence checks of Theorems 2 and 3 (SCIENCE.md D.4, E.6, E.7):
// the gradient of the loss along the canonical coordinates (alpha, beta,
// gamma, delta) of the 2-layer paper model on associative recall, at the
// zero point (alpha = beta = gamma = 0, delta = 0 or delta*) or a seeded
// point, for a grid of data statistics. Engine-private (the Analyzer's entry
// point is ImirDataDependence); this header is torch-free, the
// implementation uses LibTorch.
//
// At the zero point both attention layers are uniform, so for every single
// sequence dl/dgamma = sum_v p_v count_v / T - count_y / T with p =
// softmax(delta e_{C(q)}) for a common query token q and uniform otherwise:
// the check compares autograd with this count, sequence by sequence.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "circuitlab/v1/spec.pb.h"

namespace circuitlab::engine {

struct DataDependencePoint {
  double rare_fraction = 1.0;  // f_r
  double variability = 0.0;    // f_v
  bool variant_mode = true;    // VARIANT (else REPAIR)
  int64_t burstiness = 1;      // b
  double delta = 0.0;          // the in-weights coordinate's raw value
  double abg = 0.0;            // alpha = beta = gamma at the point (0 = the zero point)
};

struct DataDependenceRow {
  DataDependencePoint point;
  double grad[4] = {0, 0, 0, 0};  // mean dL/d(alpha, beta, gamma, delta), raw coordinates
  double gamma_stderr = 0;        // standard error of grad[2]
  double closed_form_gamma = 0;   // D.4's expectation at the realised query kinds (zero point only)
  // grad[2] / the same with f_r = 1 (same b, delta, abg); |grad_abg| ratio likewise.
  double ratio = 0, ratio_vector = 0;
  double phi = 0;                 // f_r + (1 - f_r) f_v
  double identity_max_rel_error = 0;  // zero point: autograd vs the per-sequence count, worst sequence
};

struct DataDependenceConfig {
  int64_t samples = 65536;  // N per grid point
  int64_t chunk = 1024;  // float64 activations of a chunk stay below the mmap threshold
  int64_t identity_sequences = 64;  // checked one by one at zero points
  uint64_t seed = 1;
};

// `base` is a resolved associative-recall spec with num_common > 0 (its task
// sizes are used; its data section is replaced by each point). Rows follow
// `points`; a reference point with f_r = 1 is computed for each (b, delta,
// abg, mode) as needed. `progress(done, total)`: false stops.
std::vector<DataDependenceRow> CheckDataDependence(const v1::ExperimentSpec& base,
                                                   const std::vector<DataDependencePoint>& points,
                                                   const DataDependenceConfig& config,
                                                   const std::function<bool(int64_t, int64_t)>& progress = {});

// delta* = ln(99 (V_out - 1)): in-weights learning puts >= 0.99 on C(a).
inline double SaturatedDelta(int64_t vocab) { return std::log(99.0 * static_cast<double>(vocab - 1)); }

}  // namespace circuitlab::engine
