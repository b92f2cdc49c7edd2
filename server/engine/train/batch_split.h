// A training step's forward and backward split over threads by batch rows
// (data parallelism inside one run): how a decoder run uses
// `--threads-per-run` on the CPU. Engine-private (includes LibTorch).
//
// At the decoder's sizes one step is a few hundred small GEMMs and
// elementwise ops; LibTorch's intra-op pool splits each op and pays a
// barrier per op, so two threads gave ~1.25x (bench/RESULTS.md). Rows split
// into contiguous slices, one thread each with LibTorch and BLAS at one
// thread, share nothing but the weights until the gradients are summed.
//
// Determinism: the slices are fixed by (rows, parts), each slice's
// gradient is computed apart (torch::autograd::grad, no accumulation
// across threads) and the gradients are summed in slice order, so a run is
// bit-for-bit repeatable at a given thread count. Different thread counts
// give results that differ in the last bits (sums in another order).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>
#include <vector>

namespace circuitlab::engine {

struct PartOutput {
  torch::Tensor loss;  // [E]: the members' mean loss over the part's rows, with its graph
  std::vector<std::pair<const char*, torch::Tensor>> extra;  // [E] each: means over the part's rows, no graph
};
// The loss of rows [lo, lo + count) of the step's batch.
using PartLoss = std::function<PartOutput(int64_t lo, int64_t count)>;

// While one exists, OpenBLAS runs one thread (its count is process-wide);
// when the last one goes, it gets `restore` threads back (the server's
// --threads-per-run, what IMIR runs use).
class BlasSingleThreaded {
 public:
  explicit BlasSingleThreaded(int restore);
  ~BlasSingleThreaded();
  BlasSingleThreaded(const BlasSingleThreaded&) = delete;
  BlasSingleThreaded& operator=(const BlasSingleThreaded&) = delete;

 private:
  int restore_;
};

// Rows [lo, lo + count) of slice `part` of `rows` split into `parts` near-equal contiguous slices.
std::pair<int64_t, int64_t> SliceOf(int64_t rows, int parts, int part);

// The gradient of the members' mean loss over `rows` rows, written to
// `params`' .grad, and that loss and the extra metrics (row-weighted means,
// detached). parts <= 1: `loss_of(0, rows)` and one backward on the calling
// thread (the .grad must be zero or undefined before). parts > 1:
// min(parts, rows) slices, slice 0 on the calling thread and the others on
// threads of their own (each at one LibTorch thread); .grad is replaced.
// An exception on any slice's thread is rethrown here after all joined.
PartOutput BackwardInParts(int parts, int64_t rows, const std::vector<torch::Tensor>& params, const PartLoss& loss_of);

}  // namespace circuitlab::engine
