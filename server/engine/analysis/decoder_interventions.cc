#include "server/engine/analysis/decoder_interventions.h"

#include <map>
#include <numeric>

#include "server/common/seeds.h"
#include "server/common/text.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/train/latent_trainer.h"
#include "server/engine/train/regression_trainer.h"
#include "server/engine/train/trainer_base.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

constexpr int64_t kInterveneChunk = 256;
// Sequences per chunk of the reference law (the known-pool posterior is [chunk, T, tasks]).
constexpr int64_t kInterveneBayesChunk = 64;

// Task vectors of a replace-convex op from its captured reference (the
// majors' sequences, task b % K): theta_k(p) = mean_k(p) - mean over k; then
// the per-sequence edit for `lambda` [n, K] (SCIENCE.md D.5.7).
void PrepareConvex(PreparedOp& p, const LatentTaskGenerator& task, const torch::Tensor& lambda, int64_t n) {
  const int64_t K = task.num_majors();
  torch::Tensor ref = p.ref.to(torch::kDouble);  // [n, T, D]
  torch::Tensor of = torch::arange(n, torch::kLong).remainder(K);
  torch::Tensor sums = torch::zeros({K, ref.size(1), ref.size(2)}, torch::kDouble).index_add_(0, of, ref);
  torch::Tensor counts = torch::zeros({K}, torch::kDouble).index_add_(0, of, torch::ones({n}, torch::kDouble));
  torch::Tensor means = sums / counts.clamp_min(1).view({K, 1, 1});
  torch::Tensor theta = means - means.mean(0);  // [K, T, D]
  if (p.op->subtract() == "projection") {
    torch::Tensor rows = p.rows.nonzero().flatten();
    torch::Tensor bar = theta.index_select(1, rows).mean(1);  // [K, D]
    torch::Tensor span = OrthonormalColumns(bar.t());
    p.projector = torch::matmul(span, span.t()).to(torch::kFloat);
    p.target = torch::matmul(lambda, bar).to(torch::kFloat);  // [n, D]
    p.delta = torch::Tensor();
  } else {
    torch::Tensor mix = torch::einsum("nk,ktd->ntd", {lambda, theta});
    p.delta = (mix - theta.index_select(0, of)).to(torch::kFloat);  // the id set's sequence b has task b % K
    p.projector = p.target = torch::Tensor();
  }
}

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

// Sums over a chunk's sequences ([1, count, T, V] logits, [1, count, T]
// tokens whose next token is the answer) of the next-token loss, the accuracy
// and the logit difference of `pair` (when given), each a mean over the
// predicting positions of a sequence.
PatchScores ChunkSums(const torch::Tensor& logits, const torch::Tensor& target,
                      const google::protobuf::RepeatedField<uint32_t>& pair) {
  const int64_t T = logits.size(2);
  PatchScores m;
  m.loss = NextTokenLoss(logits, target).sum().item<double>();
  torch::Tensor l = logits.narrow(2, 0, T - 1).to(torch::kDouble);
  m.accuracy = (l.argmax(-1) == target.narrow(2, 1, T - 1)).to(torch::kDouble).mean(2).sum().item<double>();
  if (!pair.empty()) m.logit_diff = (l.select(-1, pair[0]) - l.select(-1, pair[1])).mean(2).sum().item<double>();
  return m;
}

// A token decoder's loss, accuracy and logit difference (`pair`, when
// given) on `inputs` [n, T] with `ops`, against the answers of `answers`.
PatchScores TokenScores(const DecoderModel& model, const torch::Tensor& inputs, const torch::Tensor& answers,
                        const std::vector<PreparedOp>& ops, const google::protobuf::RepeatedField<uint32_t>& pair) {
  const int64_t n = inputs.size(0);
  PatchScores m;
  for (int64_t b = 0; b < n; b += kInterveneChunk) {
    const int64_t count = std::min(kInterveneChunk, n - b);
    const HookFn edit = EditHook(ops, b);
    torch::Tensor logits = model.Forward(inputs.narrow(0, b, count).unsqueeze(0), ops.empty() ? nullptr : &edit);
    const PatchScores c = ChunkSums(logits, answers.narrow(0, b, count).unsqueeze(0), pair);
    m.loss += c.loss;
    m.accuracy += c.accuracy;
    m.logit_diff += c.logit_diff;
  }
  const double dn = static_cast<double>(n);
  return {m.loss / dn, m.accuracy / dn, m.logit_diff / dn};
}

// The rules OP_REPLACE_CONVEX adds on a latent run.
absl::Status CheckConvex(const v1::Intervention& op, const HookPoint& hp, const std::string& field,
                         const LatentTaskGenerator& task) {
  if (hp.kind == HookPoint::Kind::kHead) {
    return absl::InvalidArgumentError(field +
                                      ": OP_REPLACE_CONVEX edits a stream point (embed, resid_pre, "
                                      "post_attn, post_mlp), not attn.head");
  }
  if (!task.has_bayes()) {
    return absl::FailedPreconditionError(field +
                                         ": OP_REPLACE_CONVEX needs a DICE or MARKOV task (its "
                                         "mixture laws)");
  }
  if (!op.weights().empty() && op.weights_size() != task.num_majors()) {
    return absl::InvalidArgumentError(field + ".weights must have one entry per major task (" +
                                      std::to_string(task.num_majors()) + "), got " +
                                      std::to_string(op.weights_size()));
  }
  double total = 0;
  for (double w : op.weights()) total += w;
  if (!op.weights().empty() && !(total > 0)) return absl::InvalidArgumentError(field + ".weights must not all be zero");
  if (op.weights().empty() && !(op.value() >= 0 && op.value() <= 100)) {
    return absl::InvalidArgumentError(field +
                                      ".value (the Dirichlet concentration) must be in [0, 100] "
                                      "(0 = 1), got " +
                                      std::to_string(op.value()));
  }
  if (!op.subtract().empty() && op.subtract() != "true_task" && op.subtract() != "projection") {
    return absl::InvalidArgumentError(field + ".subtract must be true_task or projection, got " + Quote(op.subtract()));
  }
  if (!op.reference_set().empty() && op.reference_set() != "id") {
    return absl::InvalidArgumentError(field + ".reference_set: the task vectors come from the majors (id)");
  }
  return absl::OkStatus();
}

// One evaluated set of a latent run: its sequences, the prepared ops (their
// references captured), the replace-convex op whose lambda defines kl_ref's
// law (or null) and that lambda [n, K].
struct LatentSetEval {
  const LatentEvalSetDef* set;
  torch::Tensor tokens;  // [n, T]
  const PreparedOp* convex = nullptr;
  torch::Tensor convex_lambda;
};

// The clean and intervened effects of `ops` on one evaluated set.
v1::InterventionEffect LatentEffect(const DecoderModel& model, const LatentTaskGenerator& task,
                                    const v1::InterveneRequest& request, const std::vector<PreparedOp>& ops,
                                    const std::vector<AttentionMassMeter>& meters, const LatentSetEval& s) {
  const int64_t T = task.seq_len(), n = s.tokens.size(0);
  const auto& pair = request.logit_diff_tokens();
  double loss_clean = 0, loss = 0, acc_clean = 0, acc = 0, kl = 0, kl_ref_clean = 0, kl_ref = 0, ld_clean = 0, ld = 0;
  // kl_ref is averaged over every predicting position, or over the steered
  // ones for a replace-convex op.
  torch::Tensor ref_rows = torch::arange(T - 1, torch::kLong);
  if (s.convex != nullptr) {
    torch::Tensor r = s.convex->rows.narrow(0, 0, T - 1).nonzero().flatten();
    if (r.numel() > 0) ref_rows = r;
  }
  const bool major = s.set->pool == LatentPool::kMajor;
  std::vector<AttentionMassMeter> clean_mass = FreshCopies(meters), hit_mass = FreshCopies(meters);
  const HookFn clean_hook = MeteredHook(nullptr, clean_mass);
  // Per predicting position (per_position): sums over the sequences of loss,
  // accuracy, KL, logit difference and kl_ref, clean and intervened.
  enum { kLossClean, kLoss, kAccClean, kAcc, kKl, kLdClean, kLd, kRefClean, kRef, kSeries };
  torch::Tensor series = torch::zeros({kSeries, T - 1}, torch::kDouble);
  auto add = [&](int row, const torch::Tensor& per) { series[row] += per.reshape({-1, T - 1}).sum(0); };
  for (int64_t b = 0; b < n; b += kInterveneChunk) {
    const int64_t count = std::min(kInterveneChunk, n - b);
    torch::Tensor chunk = s.tokens.narrow(0, b, count).unsqueeze(0);
    const HookFn edit = EditHook(ops, b), metered = MeteredHook(&edit, hit_mass);
    // No ops (a patch sweep, a read-out of attention mass): one forward.
    torch::Tensor clean = model.Forward(chunk, &clean_hook);
    torch::Tensor edited = ops.empty() ? clean : model.Forward(chunk, &metered);
    const PatchScores sc = ChunkSums(clean, chunk, pair), se = ChunkSums(edited, chunk, pair);
    loss_clean += sc.loss;
    loss += se.loss;
    acc_clean += sc.accuracy;
    acc += se.accuracy;
    ld_clean += sc.logit_diff;
    ld += se.logit_diff;
    torch::Tensor next = chunk.narrow(2, 1, T - 1);
    torch::Tensor lc = torch::log_softmax(clean.narrow(2, 0, T - 1).to(torch::kDouble), -1);
    torch::Tensor le = torch::log_softmax(edited.narrow(2, 0, T - 1).to(torch::kDouble), -1);
    kl += (lc.exp() * (lc - le)).sum(-1).mean(2).sum().item<double>();
    if (request.per_position()) {
      torch::Tensor at = next.unsqueeze(-1);
      add(kLossClean, -lc.gather(-1, at).squeeze(-1));
      add(kLoss, -le.gather(-1, at).squeeze(-1));
      add(kAccClean, (lc.argmax(-1) == next).to(torch::kDouble));
      add(kAcc, (le.argmax(-1) == next).to(torch::kDouble));
      add(kKl, (lc.exp() * (lc - le)).sum(-1));
    }
    if (!pair.empty() && request.per_position()) {
      add(kLdClean, lc.select(-1, pair[0]) - lc.select(-1, pair[1]));  // log-softmax differences = logit ones
      add(kLd, le.select(-1, pair[0]) - le.select(-1, pair[1]));
    }
    if (!task.has_bayes()) continue;
    // The reference law in chunks of kInterveneBayesChunk ([chunk, T, tasks] for the known pool).
    for (int64_t q0 = 0; q0 < count; q0 += kInterveneBayesChunk) {
      const int64_t qn = std::min(kInterveneBayesChunk, count - q0);
      torch::Tensor seqs = s.tokens.narrow(0, b + q0, qn);
      torch::Tensor q;
      if (s.convex != nullptr) {  // the mixture law the steering aims at
        torch::Tensor lam = s.convex_lambda.narrow(0, b + q0, qn).unsqueeze(1).expand({qn, T, task.num_majors()});
        q = task.MixLaws(seqs, lam, task.pool(LatentPool::kMajor)).narrow(1, 0, T - 1);
      } else {
        q = (major ? task.KnownPool(seqs).probs : task.Extrapolation(seqs)).narrow(1, 0, T - 1);
      }
      torch::Tensor logq = q.clamp_min(1e-300).log();
      auto kl_to_q = [&](const torch::Tensor& lp, int row) {
        torch::Tensor l = lp.squeeze(0).narrow(0, q0, qn);
        torch::Tensor per = (l.exp() * (l - logq)).sum(-1);  // [qn, T-1]
        if (request.per_position()) add(row, per);
        return per.index_select(1, ref_rows).mean(1).sum().item<double>();
      };
      kl_ref_clean += kl_to_q(lc, kRefClean);
      kl_ref += kl_to_q(le, kRef);
    }
  }
  if (ops.empty()) hit_mass = clean_mass;
  v1::InterventionEffect e;
  ReportMass(clean_mass, hit_mass, request.per_position(), e);
  e.set_eval_set(s.set->name);
  const double dn = static_cast<double>(n);
  e.set_loss_clean(loss_clean / dn);
  e.set_loss(loss / dn);
  e.set_accuracy_clean(acc_clean / dn);
  e.set_accuracy(acc / dn);
  e.set_kl_clean(kl / dn);
  if (!pair.empty()) {
    e.set_has_logit_diff(true);
    e.set_alt_name(LogitDiffName(pair));
    e.set_logit_diff_clean(ld_clean / dn);
    e.set_logit_diff(ld / dn);
  }
  if (task.has_bayes()) {
    e.set_has_kl_ref(true);
    e.set_ref_name(s.convex != nullptr ? "mixture" : major ? "bayes" : "extrapolation");
    e.set_kl_ref_clean(kl_ref_clean / dn);
    e.set_kl_ref(kl_ref / dn);
  }
  if (request.per_position()) {  // position t: the prediction of token t + 1
    series /= dn;
    for (int64_t t = 0; t < T - 1; ++t) {
      auto v = [&](int row) { return series[row][t].item<double>(); };
      v1::PositionEffect* p = e.add_positions();
      p->set_position(static_cast<uint32_t>(t));
      p->set_loss_clean(v(kLossClean));
      p->set_loss(v(kLoss));
      p->set_accuracy_clean(v(kAccClean));
      p->set_accuracy(v(kAcc));
      p->set_kl_clean(v(kKl));
      p->set_logit_diff_clean(v(kLdClean));
      p->set_logit_diff(v(kLd));
      p->set_kl_ref_clean(v(kRefClean));
      p->set_kl_ref(v(kRef));
    }
  }
  return e;
}

// lambda [n, K] of a replace-convex op on set si: its weights, or
// Dirichlet(value) per sequence.
torch::Tensor ConvexLambda(const v1::Intervention& op, int64_t n, int64_t K, uint64_t seed, int si) {
  if (!op.weights().empty()) {
    torch::Tensor w = torch::tensor(std::vector<double>(op.weights().begin(), op.weights().end()), torch::kDouble);
    return (w / w.sum()).unsqueeze(0).expand({n, K}).contiguous();
  }
  torch::Generator gen = MakeGenerator(DeriveSeed63(seed, "intervene/convex", static_cast<uint64_t>(si)));
  torch::Tensor g = at::_standard_gamma(torch::full({n, K}, op.value() == 0 ? 1.0 : op.value(), torch::kDouble), gen);
  return g / g.sum(-1, true).clamp_min(1e-300);
}

}  // namespace

absl::StatusOr<v1::InterveneResponse> InterveneDecoder(const DecoderModel& model, const LatentTaskGenerator& task,
                                                       const v1::InterveneRequest& request) {
  torch::NoGradGuard no_grad;
  const DecoderConfig& cfg = model.config();
  const int64_t T = task.seq_len();
  const SetIndex index(task.num_minors() > 0);
  const std::vector<LatentEvalSetDef>& sets = index.sets;

  // ---- validate and prepare every op ----
  auto check = [&](const v1::Intervention& op, const HookPoint& hp, const std::string& field) -> absl::Status {
    return op.op() == v1::Intervention::OP_REPLACE_CONVEX ? CheckConvex(op, hp, field, task) : absl::OkStatus();
  };
  absl::StatusOr<std::vector<PreparedOp>> prepared = PrepareOps(request, cfg, T, index, check);
  if (!prepared.ok()) return prepared.status();
  std::vector<PreparedOp>& ops = *prepared;
  absl::StatusOr<std::vector<AttentionMassMeter>> meters = PrepareMass(request, cfg, T, TokenAnswers(T));
  if (!meters.ok()) return meters.status();
  if (absl::Status s = CheckLogitDiffTokens(request.logit_diff_tokens(), cfg.vocab); !s.ok()) return s;
  absl::StatusOr<PatchPlan> patch = PreparePatch(request, cfg, T, TokenAnswers(T), index);
  if (!patch.ok()) return patch.status();
  absl::StatusOr<std::vector<int>> picked = index.Chosen(request.eval_sets());
  if (!picked.ok()) return picked.status();
  const std::vector<int>& chosen = *picked;
  for (const PreparedOp& p : ops) {
    if (p.op->op() != v1::Intervention::OP_REPLACE_CONVEX || p.op->subtract() == "projection") continue;
    for (int i : chosen) {
      if (sets[static_cast<size_t>(i)].pool != LatentPool::kMajor) {
        return absl::InvalidArgumentError(p.field + ": OP_REPLACE_CONVEX with subtract true_task needs eval_sets "
                                          "[\"id\"] (the majors, whose true task is known); use subtract "
                                          "projection for other sets");
      }
    }
  }

  // Sequences of set i: evaluation and reference draws, fixed by the seed.
  const int64_t n = request.n_eval();
  auto draw = [&](int i, const char* purpose) {
    torch::Generator gen = MakeGenerator(DeriveSeed63(request.seed(), purpose, static_cast<uint64_t>(i)));
    const LatentPool pool = sets[static_cast<size_t>(i)].pool;
    return task.SamplePool(pool, torch::arange(n, torch::kLong).remainder(task.pool(pool).size(0)), gen).tokens;
  };
  const PreparedOp* convex = nullptr;  // the (last) replace-convex op: its lambda defines kl_ref's law
  for (const PreparedOp& p : ops) {
    if (p.op->op() == v1::Intervention::OP_REPLACE_CONVEX) convex = &p;
  }
  v1::InterveneResponse response;
  for (int si : chosen) {
    LatentSetEval eval{&sets[static_cast<size_t>(si)], draw(si, "intervene/eval"), convex, torch::Tensor()};
    auto reference = [&](const PreparedOp& p) {  // replace-convex's task vectors come from the majors
      if (p.op->op() == v1::Intervention::OP_REPLACE_CONVEX) return index.Find("id");
      return p.op->reference_set().empty() ? si : index.Find(p.op->reference_set());
    };
    absl::Status s = CaptureReferences(ops, model, si, n, T, request.seed(), reference,
                                       [&](int ri) { return draw(ri, "intervene/reference"); });
    if (!s.ok()) return s;
    // lambda depends on the op and the set only: drawn once per replace-convex op.
    const int64_t K = task.num_majors();
    if (convex != nullptr) eval.convex_lambda = ConvexLambda(*convex->op, n, K, request.seed(), si);
    for (PreparedOp& p : ops) {
      if (p.op->op() != v1::Intervention::OP_REPLACE_CONVEX) continue;
      PrepareConvex(p, task, &p == convex ? eval.convex_lambda : ConvexLambda(*p.op, n, K, request.seed(), si), n);
    }
    v1::InterventionEffect& e = *response.add_effects();
    e = LatentEffect(model, task, request, ops, *meters, eval);
    if (!request.has_patch()) continue;
    const std::string& from = request.patch().reference_set();
    const torch::Tensor source = draw(from.empty() ? si : index.Find(from), "intervene/reference");
    const auto& pair = request.logit_diff_tokens();
    s = DecoderPatch(
        model, *patch, n, T, eval.tokens, source, {e.loss_clean(), e.accuracy_clean(), e.logit_diff_clean()},
        [&](const torch::Tensor& inputs, const std::vector<PreparedOp>& with) {
          return TokenScores(model, inputs, eval.tokens, with, pair);
        },
        e);
    if (!s.ok()) return s;
  }
  return response;
}

absl::StatusOr<v1::InterveneResponse> InterveneRegression(const DecoderModel& model,
                                                          const RegressionTaskGenerator& task,
                                                          const v1::InterveneRequest& request) {
  torch::NoGradGuard no_grad;
  const int64_t points = task.num_points(), T = 3 * points;
  const SetIndex index(task.num_minors() > 0);
  auto check = [](const v1::Intervention& op, const HookPoint&, const std::string& field) -> absl::Status {
    if (op.op() != v1::Intervention::OP_REPLACE_CONVEX) return absl::OkStatus();
    return absl::FailedPreconditionError(field + ": OP_REPLACE_CONVEX takes DICE and MARKOV runs (an E2 run's "
                                         "per-task mean states carry almost none of its state; see the steering "
                                         "analysis)");
  };
  absl::StatusOr<std::vector<PreparedOp>> prepared = PrepareOps(request, model.config(), T, index, check);
  if (!prepared.ok()) return prepared.status();
  std::vector<PreparedOp>& ops = *prepared;
  const std::vector<int64_t> answers = RegressionAnswers(points);
  absl::StatusOr<std::vector<AttentionMassMeter>> meters = PrepareMass(request, model.config(), T, answers);
  if (!meters.ok()) return meters.status();
  absl::StatusOr<PatchPlan> patch = PreparePatch(request, model.config(), T, answers, index);
  if (!patch.ok()) return patch.status();
  if (!request.logit_diff_tokens().empty()) {
    return absl::FailedPreconditionError("logit_diff_tokens: a regression run predicts a number, it has no logits");
  }
  absl::StatusOr<std::vector<int>> chosen = index.Chosen(request.eval_sets());
  if (!chosen.ok()) return chosen.status();

  const int64_t n = request.n_eval();
  auto draw = [&](int i, const char* purpose) {
    torch::Generator gen = MakeGenerator(DeriveSeed63(request.seed(), purpose, static_cast<uint64_t>(i)));
    const LatentPool pool = index.sets[static_cast<size_t>(i)].pool;
    return task.SamplePool(pool, torch::arange(n, torch::kLong).remainder(task.pool(pool).size(0)), gen);
  };
  v1::InterveneResponse response;
  for (int si : *chosen) {
    const RegressionBatch eval = draw(si, "intervene/eval");
    const torch::Tensor inputs = MemberInputs(model, eval.x, eval.y);  // [n, T, d + 1]
    absl::Status s = CaptureReferences(
        ops, model, si, n, T, request.seed(),
        [&](const PreparedOp& p) { return p.op->reference_set().empty() ? si : index.Find(p.op->reference_set()); },
        [&](int ri) {
          const RegressionBatch ref = draw(ri, "intervene/reference");
          return MemberInputs(model, ref.x, ref.y);
        });
    if (!s.ok()) return s;
    // The set's Bayes predictor: retrieval over the known tasks on id, ridge elsewhere.
    const bool major = index.sets[static_cast<size_t>(si)].pool == LatentPool::kMajor;
    std::vector<torch::Tensor> refs;
    for (int64_t b = 0; b < n; b += kInterveneBayesChunk) {
      const int64_t c = std::min(kInterveneBayesChunk, n - b);
      torch::Tensor x = eval.x.narrow(0, b, c), y = eval.y.narrow(0, b, c);
      refs.push_back(major ? task.KnownPool(x, y).mean : task.Ridge(x, y));
    }
    const torch::Tensor bayes = torch::cat(refs, 0);  // [n, points]
    double loss_clean = 0, loss = 0, shift = 0, to_ref_clean = 0, to_ref = 0;
    // Per ⊢ position (per_position): squared error, shift and distance to the reference, summed over sequences.
    enum { kLossClean, kLoss, kShift, kRefClean, kRef, kSeries };
    torch::Tensor series = torch::zeros({kSeries, points}, torch::kDouble);
    std::vector<AttentionMassMeter> clean_mass = FreshCopies(*meters), hit_mass = FreshCopies(*meters);
    const HookFn clean_hook = MeteredHook(nullptr, clean_mass);
    for (int64_t b = 0; b < n; b += kInterveneChunk) {
      const int64_t count = std::min(kInterveneChunk, n - b);
      torch::Tensor chunk = inputs.narrow(0, b, count).unsqueeze(0);
      const HookFn edit = EditHook(ops, b), metered = MeteredHook(&edit, hit_mass);
      torch::Tensor clean = DecoderModel::Predictions(model.Forward(chunk, &clean_hook)).squeeze(0).to(torch::kDouble);
      // No ops (a patch sweep, a read-out of attention mass): one forward.
      torch::Tensor edited =
          ops.empty() ? clean : DecoderModel::Predictions(model.Forward(chunk, &metered)).squeeze(0).to(torch::kDouble);
      torch::Tensor y = eval.y.narrow(0, b, count), q = bayes.narrow(0, b, count);
      auto sq = [&](const torch::Tensor& a, const torch::Tensor& c, int row) {
        const torch::Tensor per = (a - c).pow(2);  // [count, points]
        if (request.per_position()) series[row] += per.sum(0);
        return per.mean(1).sum().item<double>();
      };
      loss_clean += sq(clean, y, kLossClean);
      loss += sq(edited, y, kLoss);
      shift += sq(edited, clean, kShift);
      to_ref_clean += sq(clean, q, kRefClean);
      to_ref += sq(edited, q, kRef);
    }
    if (ops.empty()) hit_mass = clean_mass;
    v1::InterventionEffect& e = *response.add_effects();
    ReportMass(clean_mass, hit_mass, request.per_position(), e);
    const double dn = static_cast<double>(n);
    e.set_eval_set(index.sets[static_cast<size_t>(si)].name);
    e.set_loss_clean(loss_clean / dn);
    e.set_loss(loss / dn);
    e.set_kl_clean(shift / dn);
    e.set_has_kl_ref(true);
    e.set_ref_name(major ? "bayes" : "ridge");
    e.set_kl_ref_clean(to_ref_clean / dn);
    e.set_kl_ref(to_ref / dn);
    series /= dn;
    for (int64_t i = 0; request.per_position() && i < points; ++i) {
      auto v = [&](int row) { return series[row][i].item<double>(); };
      v1::PositionEffect* p = e.add_positions();
      p->set_position(static_cast<uint32_t>(answers[static_cast<size_t>(i)]));
      p->set_loss_clean(v(kLossClean));
      p->set_loss(v(kLoss));
      p->set_kl_clean(v(kShift));
      p->set_kl_ref_clean(v(kRefClean));
      p->set_kl_ref(v(kRef));
    }
    if (!request.has_patch()) continue;
    const std::string& from = request.patch().reference_set();
    const RegressionBatch source = draw(from.empty() ? si : index.Find(from), "intervene/reference");
    auto score = [&](const torch::Tensor& in, const std::vector<PreparedOp>& with) {
      double sum = 0;
      for (int64_t b = 0; b < n; b += kInterveneChunk) {
        const int64_t count = std::min(kInterveneChunk, n - b);
        const HookFn edit = EditHook(with, b);
        torch::Tensor pred = DecoderModel::Predictions(
                                 model.Forward(in.narrow(0, b, count).unsqueeze(0), with.empty() ? nullptr : &edit))
                                 .squeeze(0)
                                 .to(torch::kDouble);
        sum += (pred - eval.y.narrow(0, b, count)).pow(2).mean(1).sum().item<double>();
      }
      return PatchScores{sum / dn, 0, 0};
    };
    s = DecoderPatch(model, *patch, n, T, inputs, MemberInputs(model, source.x, source.y), {e.loss_clean(), 0, 0},
                     score, e);
    if (!s.ok()) return s;
  }
  return response;
}

// The analysis table's entries (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("latent", v1::InterveneRequest, v1::InterveneResponse,
                           [](const AnalysisInput& in, const v1::InterveneRequest& r, const AnalysisProgress&, const CancelToken*) { return WithDecoder<LatentTaskGenerator>(in, [&](const DecoderModel& m, const LatentTaskGenerator& t) { return r.has_prompts() ? InterveneDecoderPrompts(m, r) : InterveneDecoder(m, t, r); }); });
CIRCUITLAB_ENGINE_ANALYSIS("regression", v1::InterveneRequest, v1::InterveneResponse,
                           [](const AnalysisInput& in, const v1::InterveneRequest& r, const AnalysisProgress&, const CancelToken*) { return WithDecoder<RegressionTaskGenerator>(in, [&](const DecoderModel& m, const RegressionTaskGenerator& t) {
                             if (r.has_prompts()) return absl::StatusOr<v1::InterveneResponse>(absl::FailedPreconditionError("prompts: a regression run reads vectors, not token prompts"));
                             return InterveneRegression(m, t, r); }); });

}  // namespace circuitlab::engine
