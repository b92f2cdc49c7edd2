#include "server/engine/analysis/decoder_interventions.h"

#include <map>
#include <numeric>

#include "server/common/seeds.h"
#include "server/common/text.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/setup/decoder_setup.h"
#include "server/engine/setup/checkpoint_io.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/decoder_op_steps.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

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

// LatentEffect's per-position sums (rows of `series` [kSeries, T - 1]).
enum { kLossClean, kLoss, kAccClean, kAcc, kKl, kLdClean, kLd, kRefClean, kRef, kSeries };

// The per-position means `series` [kSeries, T - 1] as the effect's
// positions (position t: the prediction of token t + 1).
void AddPositions(const torch::Tensor& series, v1::InterventionEffect& e) {
  for (int64_t t = 0; t < series.size(1); ++t) {
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

// The reference law of kl_ref at the predicting positions [qn, T - 1, V] of
// `seqs` (rows from `first` of the evaluated set): the mixture a
// replace-convex op steers to, else the known pool's Bayes law on the majors
// and the extrapolating one elsewhere.
torch::Tensor ReferenceLaw(const LatentTaskGenerator& task, const LatentSetEval& s, const torch::Tensor& seqs,
                           int64_t first) {
  const int64_t T = task.seq_len(), qn = seqs.size(0);
  if (s.convex != nullptr) {
    torch::Tensor lam = s.convex_lambda.narrow(0, first, qn).unsqueeze(1).expand({qn, T, task.num_majors()});
    return task.MixLaws(seqs, lam, task.pool(LatentPool::kMajor)).narrow(1, 0, T - 1);
  }
  const bool major = s.set->pool == LatentPool::kMajor;
  return (major ? task.KnownPool(seqs).probs : task.Extrapolation(seqs)).narrow(1, 0, T - 1);
}

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
      const torch::Tensor q = ReferenceLaw(task, s, seqs, b + q0);
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
  if (request.per_position()) AddPositions(series / dn, e);
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

// The analysis table's entries (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("latent", v1::InterveneRequest, v1::InterveneResponse,
                           [](const AnalysisInput& in, const v1::InterveneRequest& r, const AnalysisProgress&, const CancelToken*) { return WithDecoder<LatentTaskGenerator>(in, [&](const DecoderModel& m, const LatentTaskGenerator& t) { return r.has_prompts() ? InterveneDecoderPrompts(m, r) : InterveneDecoder(m, t, r); }); });

}  // namespace circuitlab::engine
