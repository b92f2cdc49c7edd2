// The interface every block-list task generator implements (SCIENCE.md A.1),
// and the factory that builds one from a resolved spec. Engine-private
// (includes LibTorch).
//
// A generator turns (its fixed pool, a generator state) into a batch: every
// draw comes from the torch::Generator passed in, so a batch is a pure
// function of both. Shapes and symmetry come from tasks/catalog.h.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "circuitlab/v1/spec.pb.h"
#include "server/engine/basis/basis.h"
#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {

inline constexpr int64_t kFill = 0;  // also BOS
inline constexpr int64_t kSep = 1;
inline constexpr int64_t kQry = 2;
inline constexpr int64_t kGive = 3;

// Which distribution to sample. The values seed the evaluation sets (stable).
enum class SampleMode {
  kTrain = 0,       // the training distribution (also "train_mix" for associative recall)
  kIclRare = 1,     // associative recall: f_r = 1, b = 1
  kIclHoldout = 2,  // associative recall: query pair from held-out tokens
  kIwl = 3,         // associative recall: common canonical query, its pair not in context
  kConflict = 4,    // associative recall: context contradicts the in-weights answer
  kTest = 5,        // every other task: fresh draws from the training distribution
};

struct Batch {
  torch::Tensor tokens;          // [B, T] int64
  torch::Tensor pids;            // [B, T] int64
  torch::Tensor target;          // [B] int64
  torch::Tensor alt_target;      // [B] int64: a second answer worth scoring (see EvalSetInfo); else = target
  torch::Tensor query_kind;      // [B] int64: task-specific kind of query (0 when there is one kind)
  torch::Tensor block_of_token;  // [B, T] int64: block index (n = query block), -1 outside blocks
  torch::Tensor bayes_logp;      // [B, V] float64 log-probabilities of the Bayes predictor, or undefined
};

// One evaluation set: metrics go under eval/<name>/.
struct EvalSetInfo {
  SampleMode mode;
  std::string name;
  // When set, alt_target is scored as eval/<name>/<alt_name>_accuracy.
  std::string alt_name;
};

class BlockTask {
 public:
  virtual ~BlockTask() = default;
  // B sequences of `mode` (one of EvalSets()' modes or kTrain).
  virtual Batch Sample(int64_t batch, SampleMode mode, torch::Generator& gen) const = 0;
  virtual std::vector<EvalSetInfo> EvalSets() const = 0;
  // The declared symmetry group with this pool's relation (SCIENCE.md G.5).
  virtual TaskSymmetry Symmetry() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_positions() const = 0;  // P
  virtual int64_t seq_len() const = 0;        // T
};

// The task of a resolved spec; `pool_seed` fixes what is fixed per run (the
// common pairs of associative recall).
std::unique_ptr<BlockTask> MakeBlockTask(const v1::ExperimentSpec& resolved, uint64_t pool_seed);

// Shared sampling helpers.
// B independent uniform permutations of [0, n), first `take` entries each.
torch::Tensor RowPermutations(int64_t batch, int64_t n, int64_t take, torch::Generator& gen);
// Boolean tensor, true with probability p.
torch::Tensor Coin(torch::IntArrayRef shape, double p, torch::Generator& gen);

}  // namespace circuitlab::engine
