#include "server/engine/analysis/decoder_op_steps.h"

#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "server/common/seeds.h"
#include "server/common/text.h"
#include "server/engine/analysis/decoder_analysis.h"

namespace circuitlab::engine {

// Validates and prepares every op of `request` for a decoder with `cfg` on
// sequences of T positions. `check` sees each op with its parsed point and
// may refuse it (the model-specific rules).
absl::StatusOr<std::vector<PreparedOp>> PrepareOps(
    const v1::InterveneRequest& request, const DecoderConfig& cfg, int64_t T, const SetIndex& index,
    const std::function<absl::Status(const v1::Intervention&, const HookPoint&, const std::string&)>& check) {
  std::vector<PreparedOp> ops;
  for (int i = 0; i < request.interventions_size(); ++i) {
    const v1::Intervention& op = request.interventions(i);
    const std::string field = "interventions[" + std::to_string(i) + "]";
    if (!IsActivationOp(op.op())) {
      return absl::FailedPreconditionError(field + ": coordinate and head-ablation ops edit IMIR weights; a "
                                           "decoder run takes the hook-point ops OP_ZERO .. OP_REPLACE_CONVEX");
    }
    absl::StatusOr<HookPoint> hp = ParseHookPoint(op.hook(), cfg.layers, cfg.final_ln);
    if (!hp.ok()) return absl::InvalidArgumentError(field + ".hook: " + std::string(hp.status().message()));
    if (hp->kind == HookPoint::Kind::kLogits) {
      return absl::InvalidArgumentError(field + ".hook: logits is read, not edited; edit an earlier point");
    }
    absl::StatusOr<PreparedOp> p = PrepareActivationOp(op, field, DecoderHookGeometry(*hp, op.hook(), cfg), T);
    if (!p.ok()) return p.status();
    if (absl::Status s = check(op, *hp, field); !s.ok()) return s;
    if (!op.reference_set().empty() && index.Find(op.reference_set()) < 0) {
      return absl::InvalidArgumentError(field + ".reference_set must be one of " + index.names + ", got " +
                                        Quote(op.reference_set()));
    }
    ops.push_back(std::move(*p));
  }
  return ops;
}

// The D.6 attention_mass meters of `request` for a decoder with `cfg` on T
// positions (queries default to every position).
absl::StatusOr<std::vector<AttentionMassMeter>> PrepareMass(const v1::InterveneRequest& request,
                                                            const DecoderConfig& cfg, int64_t T,
                                                            const std::vector<int64_t>& answer) {
  std::vector<int64_t> every(static_cast<size_t>(T));
  std::iota(every.begin(), every.end(), 0);
  std::vector<AttentionMassMeter> meters;
  for (int i = 0; i < request.attention_mass_size(); ++i) {
    const v1::AttentionMass& spec = request.attention_mass(i);
    const std::string field = "attention_mass[" + std::to_string(i) + "]";
    absl::StatusOr<HookPoint> hp = ParseHookPoint(spec.pattern(), cfg.layers, cfg.final_ln);
    if (!hp.ok()) return absl::InvalidArgumentError(field + ".pattern: " + std::string(hp.status().message()));
    absl::StatusOr<AttentionMassMeter> m =
        PrepareAttentionMass(spec, field, DecoderHookGeometry(*hp, spec.pattern(), cfg), T, every, answer);
    if (!m.ok()) return m.status();
    meters.push_back(std::move(*m));
  }
  return meters;
}

// Captures, for evaluated set `si`, the reference activations of every op
// that needs them: n sequences of set `reference(p)` (drawn once per set by
// `inputs(set)`, shared by the ops that read it), run through `model`.
absl::Status CaptureReferences(std::vector<PreparedOp>& ops, const DecoderModel& model, int si, int64_t n,
                               int64_t T, uint64_t seed, const std::function<int(const PreparedOp&)>& reference,
                               const std::function<torch::Tensor(int)>& inputs) {
  std::map<int, torch::Tensor> drawn;
  for (PreparedOp& p : ops) {
    p.ref = p.mean = p.perm = torch::Tensor();
    if (!NeedsReference(p)) continue;
    const int ri = reference(p);
    auto it = drawn.find(ri);
    if (it == drawn.end()) it = drawn.emplace(ri, inputs(ri)).first;
    const torch::Tensor& ref = it->second;
    absl::Status s =
        CaptureReference(p, n, kInterveneChunk, T, DeriveSeed63(seed, "intervene/resample", static_cast<uint64_t>(si)),
                         [&](int64_t b, int64_t count, const HookFn& hook) {
                           model.Forward(ref.narrow(0, b, count).unsqueeze(0), &hook);
                         });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The answer positions of a token decoder (every predicting position) and
// of a regression run (the ⊢ positions 1, 4, 7, ...).
std::vector<int64_t> TokenAnswers(int64_t T) {
  std::vector<int64_t> out(static_cast<size_t>(T - 1));
  std::iota(out.begin(), out.end(), 0);
  return out;
}
std::vector<int64_t> RegressionAnswers(int64_t points) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < points; ++i) out.push_back(3 * i + 1);
  return out;
}

// The request's patch sweep on a decoder (empty plan without one).
absl::StatusOr<PatchPlan> PreparePatch(const v1::InterveneRequest& request, const DecoderConfig& cfg, int64_t T,
                                       const std::vector<int64_t>& answer, const SetIndex& index) {
  if (!request.has_patch()) return PatchPlan();
  if (const std::string& r = request.patch().reference_set(); !r.empty() && index.Find(r) < 0) {
    return absl::InvalidArgumentError("patch.reference_set must be one of " + index.names + ", got " + Quote(r));
  }
  return PreparePatchSweep(
      request.patch(),
      [&](const std::string& name) -> absl::StatusOr<HookGeometry> {
        absl::StatusOr<HookPoint> hp = ParseHookPoint(name, cfg.layers, cfg.final_ln);
        if (!hp.ok()) return hp.status();
        if (hp->kind == HookPoint::Kind::kLogits) {
          return absl::InvalidArgumentError("logits is read, not patched; patch an earlier point");
        }
        return DecoderHookGeometry(*hp, name, cfg);
      },
      T, answer);
}

// D.6 patch_effect on one evaluated set of a decoder run: `score(inputs,
// ops)` scores the model on `inputs` (with `ops`) against the evaluated
// sequences' answers.
absl::Status DecoderPatch(const DecoderModel& model, PatchPlan& plan, int64_t n, int64_t T,
                          const torch::Tensor& eval_inputs, const torch::Tensor& source_inputs, const PatchScores& base,
                          const std::function<PatchScores(const torch::Tensor&, const std::vector<PreparedOp>&)>& score,
                          v1::InterventionEffect& e) {
  return RunPatchSweep(
      plan, n, kInterveneChunk, T,
      [&](int64_t b, int64_t count, const HookFn& hook) {
        model.Forward(source_inputs.narrow(0, b, count).unsqueeze(0), &hook);
      },
      base, score(source_inputs, {}), [&](const std::vector<PreparedOp>& ops) { return score(eval_inputs, ops); }, e);
}

}  // namespace circuitlab::engine
