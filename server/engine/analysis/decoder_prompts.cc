// Intervene on the caller's own prompts with a token decoder
// (InterveneRequest.prompts): the hook-point ops, attention mass and patch
// sweeps of SCIENCE.md D.6, every metric read at the last position of each
// prompt against the prompts' answers. The ops' reference (mean, resample)
// is the clean prompts; a patch sweep patches clean into corrupted.
#include <vector>

#include "server/common/seeds.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/analysis/prompts.h"

namespace circuitlab::engine {
namespace {

// Loss, accuracy and logit difference (answer - wrong) at the last position
// of logits [1, n, T, V].
PatchScores LastScores(const torch::Tensor& logits, const PromptSet& p) {
  const torch::Tensor l = logits[0].select(1, logits.size(2) - 1).to(torch::kDouble);  // [n, V]
  PatchScores m;
  m.loss = torch::nn::functional::cross_entropy(l, p.answers).item<double>();
  m.accuracy = (l.argmax(-1) == p.answers).to(torch::kDouble).mean().item<double>();
  if (p.wrong.defined()) {
    m.logit_diff = (l.gather(1, p.answers.unsqueeze(1)) - l.gather(1, p.wrong.unsqueeze(1))).mean().item<double>();
  }
  return m;
}

// A hook point of `cfg` that an op or a patch may edit (not the logits).
absl::StatusOr<HookGeometry> EditablePoint(const std::string& name, const DecoderConfig& cfg) {
  absl::StatusOr<HookPoint> hp = ParseHookPoint(name, cfg.layers, cfg.final_ln);
  if (!hp.ok()) return hp.status();
  if (hp->kind == HookPoint::Kind::kLogits) {
    return absl::InvalidArgumentError("logits is read, not edited; edit an earlier point");
  }
  return DecoderHookGeometry(*hp, name, cfg);
}

// The request's ops on prompts of T positions: hook-point ops but
// replace-convex; InvalidArgument naming the op's field.
absl::StatusOr<std::vector<PreparedOp>> PromptOps(const v1::InterveneRequest& request, const DecoderConfig& cfg,
                                                  int64_t T) {
  std::vector<PreparedOp> ops;
  for (int i = 0; i < request.interventions_size(); ++i) {
    const v1::Intervention& op = request.interventions(i);
    const std::string field = "interventions[" + std::to_string(i) + "]";
    if (!IsActivationOp(op.op())) {
      return absl::FailedPreconditionError(field + ": coordinate and head-ablation ops edit IMIR weights; a "
                                           "decoder run takes the hook-point ops OP_ZERO .. OP_ADD");
    }
    if (op.op() == v1::Intervention::OP_REPLACE_CONVEX) {
      return absl::InvalidArgumentError(field + ": OP_REPLACE_CONVEX steers along the task vectors of the run's "
                                        "own task sequences; on prompts, add a vector (OP_ADD) or patch");
    }
    absl::StatusOr<HookGeometry> g = EditablePoint(op.hook(), cfg);
    if (!g.ok()) return absl::InvalidArgumentError(field + ".hook: " + std::string(g.status().message()));
    absl::StatusOr<PreparedOp> prepared = PrepareActivationOp(op, field, *g, T);
    if (!prepared.ok()) return prepared.status();
    ops.push_back(std::move(*prepared));
  }
  return ops;
}

// The request's attention-mass meters, read at the prompts' last position.
absl::StatusOr<std::vector<AttentionMassMeter>> PromptMeters(const v1::InterveneRequest& request,
                                                             const DecoderConfig& cfg, int64_t T) {
  std::vector<AttentionMassMeter> meters;
  for (int i = 0; i < request.attention_mass_size(); ++i) {
    const std::string field = "attention_mass[" + std::to_string(i) + "]";
    absl::StatusOr<HookPoint> hp = ParseHookPoint(request.attention_mass(i).pattern(), cfg.layers, cfg.final_ln);
    if (!hp.ok()) return absl::InvalidArgumentError(field + ".pattern: " + std::string(hp.status().message()));
    absl::StatusOr<AttentionMassMeter> m = PrepareAttentionMass(
        request.attention_mass(i), field, DecoderHookGeometry(*hp, request.attention_mass(i).pattern(), cfg), T,
        {T - 1}, {T - 1});
    if (!m.ok()) return m.status();
    meters.push_back(std::move(*m));
  }
  return meters;
}

}  // namespace

absl::StatusOr<v1::InterveneResponse> InterveneDecoderPrompts(const DecoderModel& model,
                                                              const v1::InterveneRequest& request) {
  torch::NoGradGuard no_grad;
  const DecoderConfig& cfg = model.config();
  absl::StatusOr<PromptSet> read = ReadPrompts(request, cfg.vocab, 0, cfg.max_len);
  if (!read.ok()) return read.status();
  const PromptSet& p = *read;
  const int64_t n = p.clean.B, T = p.clean.T;
  const torch::Tensor& scored = (request.has_patch() ? p.corrupted : p.clean).tokens;  // [1, n, T]
  auto forward = [&](const torch::Tensor& tokens, const HookFn* hook) { return model.Forward(tokens, hook); };

  absl::StatusOr<std::vector<PreparedOp>> prepared = PromptOps(request, cfg, T);
  if (!prepared.ok()) return prepared.status();
  std::vector<PreparedOp>& ops = *prepared;
  for (PreparedOp& op : ops) {
    if (!NeedsReference(op)) continue;
    absl::Status s = CaptureReference(op, n, n, T, DeriveSeed63(request.seed(), "intervene/resample", 0),
                                      [&](int64_t b, int64_t count, const HookFn& hook) {
                                        forward(p.clean.tokens.narrow(1, b, count), &hook);
                                      });
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::vector<AttentionMassMeter>> meters = PromptMeters(request, cfg, T);
  if (!meters.ok()) return meters.status();

  std::vector<AttentionMassMeter> clean_mass = FreshCopies(*meters), hit_mass = FreshCopies(*meters);
  const HookFn clean_hook = MeteredHook(nullptr, clean_mass);
  const HookFn edit = EditHook(ops, 0), metered = MeteredHook(&edit, hit_mass);
  const torch::Tensor clean = forward(scored, &clean_hook);
  const torch::Tensor hit = ops.empty() ? clean : forward(scored, &metered);
  if (ops.empty()) hit_mass = clean_mass;
  v1::InterventionEffect e;
  ReportMass(clean_mass, hit_mass, request.per_position(), e);
  e.set_eval_set("prompts");
  const PatchScores sc = LastScores(clean, p), sh = LastScores(hit, p);
  e.set_loss_clean(sc.loss);
  e.set_loss(sh.loss);
  e.set_accuracy_clean(sc.accuracy);
  e.set_accuracy(sh.accuracy);
  const torch::Tensor lc = torch::log_softmax(clean[0].select(1, T - 1).to(torch::kDouble), -1);
  const torch::Tensor lh = torch::log_softmax(hit[0].select(1, T - 1).to(torch::kDouble), -1);
  e.set_kl_clean((lc.exp() * (lc - lh)).sum(-1).mean().item<double>());
  if (p.wrong.defined()) {
    e.set_has_logit_diff(true);
    e.set_alt_name("wrong");
    e.set_logit_diff_clean(sc.logit_diff);
    e.set_logit_diff(sh.logit_diff);
  }
  if (request.per_position()) {  // read at the last position only
    v1::PositionEffect* at = e.add_positions();
    at->set_position(static_cast<uint32_t>(T - 1));
    at->set_loss_clean(e.loss_clean());
    at->set_loss(e.loss());
    at->set_accuracy_clean(e.accuracy_clean());
    at->set_accuracy(e.accuracy());
    at->set_kl_clean(e.kl_clean());
    at->set_logit_diff_clean(e.logit_diff_clean());
    at->set_logit_diff(e.logit_diff());
  }
  if (request.has_patch()) {
    absl::StatusOr<PatchPlan> plan = PreparePatchSweep(
        request.patch(), [&](const std::string& name) { return EditablePoint(name, cfg); }, T, {T - 1});
    if (!plan.ok()) return plan.status();
    absl::Status s = RunPatchSweep(
        *plan, n, n, T,
        [&](int64_t b, int64_t count, const HookFn& hook) { forward(p.clean.tokens.narrow(1, b, count), &hook); },
        sc, LastScores(forward(p.clean.tokens, nullptr), p),
        [&](const std::vector<PreparedOp>& with) {
          const HookFn patch = EditHook(with, 0);
          return LastScores(forward(scored, &patch), p);
        },
        e);
    if (!s.ok()) return s;
  }
  v1::InterveneResponse response;
  *response.add_effects() = std::move(e);
  return response;
}

}  // namespace circuitlab::engine
