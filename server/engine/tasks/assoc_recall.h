// In-context associative recall with ICL/IWL competition (SCIENCE.md A.1.1,
// with the corrections of G.5: a BOS token starts every sequence; icl_holdout
// draws its query pair from held-out tokens and its distractors from the
// training rare pool; a common distractor that finds no unused pair becomes a
// rare pair). Engine-private (includes LibTorch).
//
// Vocabulary: [FILL, SEP, QRY, GIVE | common (V_c) | rare (V_r) | held-out (V_h)].
// Sequence (length T = 1 + n(k + gap) + k - 1):
//   BOS(=FILL)  fillers  n shuffled blocks [key, FILL x (k-2), value] each
//   preceded by 0..gap fillers   query block [key, FILL x (k-2)]
// Target: the value of the query's key. Vectorised over the batch; every
// draw comes from the generator passed in, so a batch is a pure function of
// (task pool, generator state).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "circuitlab/v1/spec.pb.h"
#include "server/engine/tasks/block_task.h"

namespace circuitlab::engine {

// What kind of query a sequence asks (per sequence, in Batch::query_kind).
enum QueryKind : int64_t {
  kQueryRare = 0,            // rare pair, answer only in context
  kQueryCommonCanon = 1,     // common pair with its fixed partner
  kQueryCommonVaried = 2,    // common pair re-paired (REPAIR) or shown as a variant (VARIANT)
  kQueryHoldout = 3,         // held-out rare pair
};

struct AssocRecallConfig {
  int64_t num_common = 32, num_rare = 64, num_heldout = 16;
  int64_t num_blocks = 8, block_length = 2;
  bool absolute_positions = false;
  int64_t num_positions = 64;
  double rare_fraction = 0.5, variability = 0.0;
  bool variant_mode = false;
  double zipf_exponent = 0.0;
  int64_t burstiness = 1, max_gap = 0;

  static AssocRecallConfig FromSpec(const v1::ExperimentSpec& resolved);
};

class AssocRecallTask : public BlockTask {
 public:
  // `pool_seed` fixes the common pairs and their Zipf rank order.
  AssocRecallTask(const AssocRecallConfig& config, uint64_t pool_seed);

  // B sequences of `mode`. Never fails for a resolved config; modes that the
  // config cannot express (see Supports) must not be asked for.
  Batch Sample(int64_t batch, SampleMode mode, torch::Generator& gen) const override;
  bool Supports(SampleMode mode) const;

  // The symmetry group of the data (SCIENCE.md A.1, G.5): classes FILL, SEP,
  // QRY, GIVE (singletons; unused ones are their own class), common (with the
  // fixed pairing), rare, held-out; cyclic position shifts in BLOCK_OFFSET
  // mode, none in ABSOLUTE mode.
  TaskSymmetry Symmetry() const override;
  // icl_rare, icl_holdout, iwl, conflict, train_mix (those the config supports).
  std::vector<EvalSetInfo> EvalSets() const override;

  int64_t vocab_size() const override { return vocab_; }
  int64_t num_positions() const override;  // P (position vocabulary)
  int64_t seq_len() const override { return seq_len_; }
  const AssocRecallConfig& config() const { return cfg_; }
  // partner()[tok] = C(tok) for common tokens, -1 otherwise. [V] int64.
  const torch::Tensor& partner() const { return partner_; }
  // [V_c/2, 2] int64: the fixed common pairs.
  const torch::Tensor& pairs() const { return pairs_; }
  int64_t rare_begin() const { return kNumSpecials + cfg_.num_common; }
  int64_t heldout_begin() const { return rare_begin() + cfg_.num_rare; }

 private:
  AssocRecallConfig cfg_;
  int64_t vocab_ = 0;
  int64_t seq_len_ = 0;
  torch::Tensor pairs_;        // [npairs, 2]
  torch::Tensor pair_log_w_;   // [npairs] float64 log Zipf weights
  torch::Tensor partner_;      // [V]
  torch::Tensor pair_of_tok_;  // [V] pair index for common tokens, -1 otherwise
};

// The evaluation sets a config supports (AssocRecallTask::EvalSets).
inline std::vector<EvalSetInfo> EvalSets(const AssocRecallTask& task) { return task.EvalSets(); }

}  // namespace circuitlab::engine
