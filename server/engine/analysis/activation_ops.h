// The hook-point operations of SCIENCE.md D.6 (zero, mean, resample,
// project-out / project-onto, add, patch, and the replace-convex edit whose
// task vectors the caller computes), independent of the model: a
// model describes the tensor at each of its hook points (HookGeometry) and
// runs its forward with the hook EditHook returns. Used by Intervene on the
// decoder (B.2) and the IMIR block model (B.1). Engine-private (LibTorch).
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/api.h"
#include "server/engine/models/hooks.h"

namespace circuitlab::engine {

// The axes of the tensor a hook point sees (the ensemble axis is 0).
struct HookGeometry {
  std::string name;
  int64_t batch_axis = 1;
  int64_t pos_axis = 2;   // what `positions` select (the query rows of a pattern)
  int64_t head_axis = -1;  // what `head` selects; -1: the point has no head axis
  int64_t heads = 0;
  int64_t width = 0;       // the last axis, which vectors must match
  bool pattern = false;    // attention probabilities: zero, mean, resample and patch only
};

// Whether `op` edits a hook point (OP_ZERO .. OP_REPLACE_CONVEX) rather
// than IMIR weights.
inline bool IsActivationOp(v1::Intervention::Op op) {
  return op >= v1::Intervention::OP_ZERO && op <= v1::Intervention::OP_REPLACE_CONVEX;
}

struct PreparedOp {
  const v1::Intervention* op = nullptr;
  std::string field;  // "interventions[i]"
  HookGeometry geo;
  torch::Tensor rows;   // bool [T]
  torch::Tensor heads;  // bool [heads], or undefined (every head)
  torch::Tensor basis;  // projections: orthonormal columns [width, r]
  torch::Tensor vec;    // add: [width]
  double scale = 1;
  // Per evaluated set: the reference activations (ensemble axis dropped),
  // their mean over the reference sequences, the resampling permutation.
  torch::Tensor ref, mean, perm;
  // Replace-convex (set by the model's caller, per evaluated set): a
  // per-sequence addition delta [n, T, width] (true_task), or the projector
  // P [width, width] with the per-sequence target [n, width] (projection;
  // `mean` is then mu_p [T, width]).
  torch::Tensor delta, projector, target;
};

// Validates `op` (positions in [0, T), head in [0, heads], vectors of the
// point's width and finite, the ops a pattern takes) against the point;
// InvalidArgument naming `field`.
absl::StatusOr<PreparedOp> PrepareActivationOp(const v1::Intervention& op, const std::string& field,
                                               const HookGeometry& geo, int64_t T);

// Whether the op reads reference activations (mean, resample, patch,
// centred projections).
bool NeedsReference(const PreparedOp& p);

// Runs `forward(begin, count, hook)` over n reference sequences in chunks of
// `chunk`, keeps the activations at the op's point and draws the
// resampling permutation from `perm_seed`. InvalidArgument when the
// reference's positions differ from the evaluated sequences' (`T`).
absl::Status CaptureReference(PreparedOp& p, int64_t n, int64_t chunk, int64_t T, uint64_t perm_seed,
                              const std::function<void(int64_t, int64_t, const HookFn&)>& forward);

// The hook applying every op (in order) to the chunk of evaluated sequences
// starting at `begin`; only the selected rows and heads change.
HookFn EditHook(const std::vector<PreparedOp>& ops, int64_t begin);

// D.6 attention_mass: the attention the chosen queries put on a key set at
// one pattern hook point, per head, averaged over sequences and queries.
class AttentionMassMeter {
 public:
  const std::string& pattern() const { return geo_.name; }
  // Adds a chunk's pattern (the tensor at the point, geometry `geo`).
  void Add(const torch::Tensor& pattern);
  std::vector<double> PerHead() const;
  // The counted queries, and per query the mass per head (query-major).
  std::vector<int64_t> Queries() const;
  std::vector<double> PerQuery() const;
  void Reset();

 private:
  friend absl::StatusOr<AttentionMassMeter> PrepareAttentionMass(const v1::AttentionMass&, const std::string&,
                                                                 const HookGeometry&, int64_t,
                                                                 const std::vector<int64_t>&,
                                                                 const std::vector<int64_t>&);
  HookGeometry geo_;
  torch::Tensor mask_;  // [T, T] double: 1 at (query, key) pairs counted
  int64_t queries_ = 0;
  torch::Tensor sums_;  // [T, heads] double: mass per query row and head
  int64_t rows_ = 0;    // sequences (times ensemble members) added
};

// Validates `spec` against the pattern point `geo` (keys: >= 0 absolute,
// < 0 relative to the query, each in [-T, T - 1]; queries in [0, T - 1], or
// the task's `answer` positions / every position by query_mask, else
// `default_queries`); InvalidArgument naming `field`. Mass is averaged over
// the queries that see at least one of the keys.
absl::StatusOr<AttentionMassMeter> PrepareAttentionMass(const v1::AttentionMass& spec, const std::string& field,
                                                        const HookGeometry& geo, int64_t T,
                                                        const std::vector<int64_t>& default_queries,
                                                        const std::vector<int64_t>& answer);

// Copies of `meters` with their sums at zero (a plain copy shares them).
std::vector<AttentionMassMeter> FreshCopies(const std::vector<AttentionMassMeter>& meters);

// D.6 logit_diff tokens: empty, or two ids below `vocab`; InvalidArgument
// naming logit_diff_tokens otherwise. The alt_name effects report.
absl::Status CheckLogitDiffTokens(const google::protobuf::RepeatedField<uint32_t>& tokens, int64_t vocab);
std::string LogitDiffName(const google::protobuf::RepeatedField<uint32_t>& tokens);

// Appends each meter's per-head mass, clean and intervened, to `e`; with
// `per_query`, its series over the counted queries too.
void ReportMass(const std::vector<AttentionMassMeter>& clean, const std::vector<AttentionMassMeter>& hit,
                bool per_query, v1::InterventionEffect& e);

// D.6 patch_effect (v1::PatchSweep): one OP_PATCH per site, hook-major,
// each hook's all-at-once site (position -1) after its single positions.
struct PatchPlan {
  std::deque<v1::Intervention> ops;  // the sites' ops (PreparedOp::op points here)
  std::vector<PreparedOp> sites;
  std::vector<int32_t> positions;  // per site; -1: every swept position
};

// The sweep's sites: its hooks through `geometry` (InvalidArgument text when
// a name is not a hook point of the model), positions in [0, T - 1] or its
// mask (`answer`: the task's answer positions; default every position).
// InvalidArgument naming patch.<field>.
absl::StatusOr<PatchPlan> PreparePatchSweep(
    const v1::PatchSweep& sweep, const std::function<absl::StatusOr<HookGeometry>(const std::string&)>& geometry,
    int64_t T, const std::vector<int64_t>& answer);

// A run's metrics scored against the evaluated sequences' answers.
struct PatchScores {
  double loss = 0, accuracy = 0, logit_diff = 0;
};

// Captures the source activations of every site (one forward pass over the
// source sequences per hook, shared by its sites; `forward` as for
// CaptureReference), then scores each site with `patched` and appends the
// effects normalised between `base` and `source` to `e`.
absl::Status RunPatchSweep(PatchPlan& plan, int64_t n, int64_t chunk, int64_t T,
                           const std::function<void(int64_t, int64_t, const HookFn&)>& forward, const PatchScores& base,
                           const PatchScores& source,
                           const std::function<PatchScores(const std::vector<PreparedOp>&)>& patched,
                           v1::InterventionEffect& e);

// The task's position set of `mask` (ANSWER: `answer`, ALL: 0..T-1).
std::vector<int64_t> MaskPositions(v1::PositionMask mask, int64_t T, const std::vector<int64_t>& answer);

// `inner` (or no edit when null), with every meter's pattern recorded as
// the forward sees it after the edit.
HookFn MeteredHook(const HookFn* inner, std::vector<AttentionMassMeter>& meters);

}  // namespace circuitlab::engine
