// The steps every decoder intervention shares (SCIENCE.md D.6), on a latent
// run (decoder_interventions.cc), a regression run
// (regression_interventions.cc) or the caller's prompts: the evaluation
// sets by name, the ops and attention-mass meters validated and prepared,
// reference activations captured, the answer positions, the patch sweep.
// Engine-private (LibTorch).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/setup/decoder_setup.h"

namespace circuitlab::engine {

inline constexpr int64_t kInterveneChunk = 256;
// Sequences per chunk of the reference law (the known-pool posterior is [chunk, T, tasks]).
inline constexpr int64_t kInterveneBayesChunk = 64;

// The evaluation sets of a latent run and how a request names them.
struct SetIndex {
  std::vector<LatentEvalSetDef> sets;
  std::string names;
  explicit SetIndex(bool has_minors) : sets(LatentEvalSets(has_minors)) {
    for (const auto& s : sets) names += (names.empty() ? "" : ", ") + s.name;
  }
  int Find(const std::string& name) const {
    for (size_t i = 0; i < sets.size(); ++i) {
      if (sets[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
  // The requested sets (all when none), or InvalidArgument.
  absl::StatusOr<std::vector<int>> Chosen(const google::protobuf::RepeatedPtrField<std::string>& requested) const {
    std::vector<int> chosen;
    for (const std::string& name : requested) {
      const int i = Find(name);
      if (i < 0) return absl::InvalidArgumentError("eval_sets: '" + name + "' is not one of " + names);
      chosen.push_back(i);
    }
    if (chosen.empty()) {
      for (size_t i = 0; i < sets.size(); ++i) chosen.push_back(static_cast<int>(i));
    }
    return chosen;
  }
};

// Validates and prepares every op of `request` for a decoder with `cfg` on
// sequences of T positions. `check` sees each op with its parsed point and
// may refuse it (the model-specific rules).
absl::StatusOr<std::vector<PreparedOp>> PrepareOps(
    const v1::InterveneRequest& request, const DecoderConfig& cfg, int64_t T, const SetIndex& index,
    const std::function<absl::Status(const v1::Intervention&, const HookPoint&, const std::string&)>& check);

// The D.6 attention_mass meters of `request` for a decoder with `cfg` on T
// positions (queries default to every position).
absl::StatusOr<std::vector<AttentionMassMeter>> PrepareMass(const v1::InterveneRequest& request,
                                                            const DecoderConfig& cfg, int64_t T,
                                                            const std::vector<int64_t>& answer);

// Captures, for evaluated set `si`, the reference activations of every op
// that needs them: n sequences of set `reference(p)` (drawn once per set by
// `inputs(set)`, shared by the ops that read it), run through `model`.
absl::Status CaptureReferences(std::vector<PreparedOp>& ops, const DecoderModel& model, int si, int64_t n,
                               int64_t T, uint64_t seed, const std::function<int(const PreparedOp&)>& reference,
                               const std::function<torch::Tensor(int)>& inputs);

// The answer positions of a token decoder (every predicting position) and
// of a regression run (the ⊢ positions 1, 4, 7, ...).
std::vector<int64_t> TokenAnswers(int64_t T);
std::vector<int64_t> RegressionAnswers(int64_t points);

// The request's patch sweep on a decoder (empty plan without one).
absl::StatusOr<PatchPlan> PreparePatch(const v1::InterveneRequest& request, const DecoderConfig& cfg, int64_t T,
                                       const std::vector<int64_t>& answer, const SetIndex& index);

// D.6 patch_effect on one evaluated set of a decoder run: `score(inputs,
// ops)` scores the model on `inputs` (with `ops`) against the evaluated
// sequences' answers.
absl::Status DecoderPatch(const DecoderModel& model, PatchPlan& plan, int64_t n, int64_t T,
                          const torch::Tensor& eval_inputs, const torch::Tensor& source_inputs, const PatchScores& base,
                          const std::function<PatchScores(const torch::Tensor&, const std::vector<PreparedOp>&)>& score,
                          v1::InterventionEffect& e);

}  // namespace circuitlab::engine
