#include "server/engine/analysis/decoder_interventions.h"

#include "server/common/seeds.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/train/latent_trainer.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {
namespace {

constexpr int64_t kChunk = 256;
// Sequences per chunk of the reference law (the known-pool posterior is [chunk, T, tasks]).
constexpr int64_t kBayesChunk = 64;

// The tensor at a decoder hook point (see decoder_model.h).
HookGeometry GeometryOf(const HookPoint& hp, const std::string& name, const DecoderConfig& cfg) {
  HookGeometry g;
  g.name = name;
  g.width = cfg.d_model;
  if (hp.kind == HookPoint::Kind::kPattern) {  // [E, B, H, T, T]
    g.pos_axis = 3;
    g.head_axis = 2;
    g.heads = cfg.heads;
    g.pattern = true;
    g.width = 0;
  } else if (hp.kind == HookPoint::Kind::kHead) {  // [E, B, T, H, d_head]
    g.head_axis = 3;
    g.heads = cfg.heads;
    g.width = cfg.d_model / cfg.heads;
  }
  return g;
}

}  // namespace

absl::StatusOr<InterveneReport> InterveneDecoder(const DecoderModel& model, const LatentTaskGenerator& task,
                                                 const InterveneRequest& request) {
  torch::NoGradGuard no_grad;
  const DecoderConfig& cfg = model.config();
  const int64_t T = task.seq_len();
  std::vector<std::pair<std::string, LatentPool>> sets = {{"id", LatentPool::kMajor}, {"ood", LatentPool::kOod}};
  if (task.num_minors() > 0) sets.emplace_back("minor", LatentPool::kMinor);
  auto find_set = [&](const std::string& name) -> int {
    for (size_t i = 0; i < sets.size(); ++i) {
      if (sets[i].first == name) return static_cast<int>(i);
    }
    return -1;
  };
  std::string set_names;
  for (const auto& s : sets) set_names += (set_names.empty() ? "" : ", ") + s.first;

  // ---- validate and prepare every op ----
  std::vector<PreparedOp> ops;
  for (size_t i = 0; i < request.ops.size(); ++i) {
    const InterventionOp& op = request.ops[i];
    const std::string field = "interventions[" + std::to_string(i) + "]";
    if (!op.activation()) {
      return absl::FailedPreconditionError(field + ": coordinate and head-ablation ops edit IMIR weights; a "
                                           "decoder run takes the hook-point ops OP_ZERO .. OP_PATCH");
    }
    absl::StatusOr<HookPoint> hp = ParseHookPoint(op.hook, cfg.layers);
    if (!hp.ok()) return absl::InvalidArgumentError(field + ".hook: " + std::string(hp.status().message()));
    if (hp->kind == HookPoint::Kind::kLogits) {
      return absl::InvalidArgumentError(field + ".hook: logits is read, not edited; edit an earlier point");
    }
    absl::StatusOr<PreparedOp> p = PrepareActivationOp(op, field, GeometryOf(*hp, op.hook, cfg), T);
    if (!p.ok()) return p.status();
    if (!op.reference_set.empty() && find_set(op.reference_set) < 0) {
      return absl::InvalidArgumentError(field + ".reference_set must be one of " + set_names + ", got '" +
                                        op.reference_set + "'");
    }
    ops.push_back(std::move(*p));
  }
  std::vector<int> chosen;
  for (const std::string& name : request.eval_sets) {
    const int i = find_set(name);
    if (i < 0) return absl::InvalidArgumentError("eval_sets: '" + name + "' is not one of " + set_names);
    chosen.push_back(i);
  }
  if (chosen.empty()) {
    for (size_t i = 0; i < sets.size(); ++i) chosen.push_back(static_cast<int>(i));
  }

  // Sequences of set i: evaluation and reference draws, fixed by the seed.
  const int64_t n = request.n_eval;
  auto draw = [&](int i, const char* purpose) {
    torch::Generator gen = MakeGenerator(DeriveSeed63(request.seed, purpose, static_cast<uint64_t>(i)));
    const LatentPool pool = sets[static_cast<size_t>(i)].second;
    return task.SamplePool(pool, torch::arange(n, torch::kLong).remainder(task.pool(pool).size(0)), gen).tokens;
  };

  InterveneReport report;
  for (int si : chosen) {
    torch::Tensor tokens = draw(si, "intervene/eval");
    for (PreparedOp& p : ops) {
      p.ref = p.mean = p.perm = torch::Tensor();
      if (!NeedsReference(p)) continue;
      const int ri = p.op->reference_set.empty() ? si : find_set(p.op->reference_set);
      const torch::Tensor ref = draw(ri, "intervene/reference");
      absl::Status s = CaptureReference(
          p, n, kChunk, T, DeriveSeed63(request.seed, "intervene/resample", static_cast<uint64_t>(si)),
          [&](int64_t b, int64_t count, const HookFn& hook) { model.Forward(ref.narrow(0, b, count).unsqueeze(0), &hook); });
      if (!s.ok()) return s;
    }
    double loss_clean = 0, loss = 0, acc_clean = 0, acc = 0, kl = 0, kl_ref_clean = 0, kl_ref = 0;
    const bool major = sets[static_cast<size_t>(si)].second == LatentPool::kMajor;
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t count = std::min(kChunk, n - b);
      torch::Tensor chunk = tokens.narrow(0, b, count).unsqueeze(0);
      const HookFn edit = EditHook(ops, b);
      torch::Tensor clean = model.Forward(chunk), edited = model.Forward(chunk, &edit);
      loss_clean += NextTokenLoss(clean, chunk).sum().item<double>();
      loss += NextTokenLoss(edited, chunk).sum().item<double>();
      torch::Tensor next = chunk.narrow(2, 1, T - 1);
      acc_clean += (clean.narrow(2, 0, T - 1).argmax(-1) == next).to(torch::kDouble).mean(2).sum().item<double>();
      acc += (edited.narrow(2, 0, T - 1).argmax(-1) == next).to(torch::kDouble).mean(2).sum().item<double>();
      torch::Tensor lc = torch::log_softmax(clean.narrow(2, 0, T - 1).to(torch::kDouble), -1);
      torch::Tensor le = torch::log_softmax(edited.narrow(2, 0, T - 1).to(torch::kDouble), -1);
      kl += (lc.exp() * (lc - le)).sum(-1).mean(2).sum().item<double>();
      if (task.has_bayes()) {
        // The reference law in chunks of kBayesChunk ([chunk, T, tasks] for the known pool).
        for (int64_t q0 = 0; q0 < count; q0 += kBayesChunk) {
          const int64_t qn = std::min(kBayesChunk, count - q0);
          torch::Tensor seqs = tokens.narrow(0, b + q0, qn);
          torch::Tensor q = (major ? task.KnownPool(seqs).probs : task.Extrapolation(seqs)).narrow(1, 0, T - 1);
          torch::Tensor logq = q.clamp_min(1e-300).log();
          auto kl_to_q = [&](const torch::Tensor& lp) {
            torch::Tensor l = lp.squeeze(0).narrow(0, q0, qn);
            return (l.exp() * (l - logq)).sum(-1).mean(1).sum().item<double>();
          };
          kl_ref_clean += kl_to_q(lc);
          kl_ref += kl_to_q(le);
        }
      }
    }
    EffectReport e;
    e.eval_set = sets[static_cast<size_t>(si)].first;
    const double dn = static_cast<double>(n);
    e.loss_clean = loss_clean / dn;
    e.loss = loss / dn;
    e.accuracy_clean = acc_clean / dn;
    e.accuracy = acc / dn;
    e.kl_clean = kl / dn;
    if (task.has_bayes()) {
      e.has_kl_ref = true;
      e.ref_name = major ? "bayes" : "extrapolation";
      e.kl_ref_clean = kl_ref_clean / dn;
      e.kl_ref = kl_ref / dn;
    }
    report.effects.push_back(e);
  }
  return report;
}

}  // namespace circuitlab::engine
