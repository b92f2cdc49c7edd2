#include "server/engine/analysis/decoder_interventions.h"

#include <cmath>

#include "server/common/seeds.h"
#include "server/engine/train/latent_trainer.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {
namespace {

using Kind = InterventionOp::Kind;
constexpr int64_t kChunk = 256;

struct Prepared {
  const InterventionOp* op = nullptr;
  std::string field;
  HookPoint point;
  std::string name;
  torch::Tensor rows;   // bool mask over the position axis [T]
  torch::Tensor heads;  // bool mask over heads [H] (attn.* points)
  torch::Tensor basis;  // project ops: orthonormal columns [w, r]
  torch::Tensor vec;    // add: [w]
  double scale = 1;
  // Per evaluated set: the reference activations [n, ...] and their
  // per-position mean [...].
  torch::Tensor ref, mean, perm;
};

bool NeedsReference(const Prepared& p) {
  const Kind k = p.op->kind;
  return k == Kind::kActMean || k == Kind::kActResample || k == Kind::kActPatch ||
         ((k == Kind::kActProjectOut || k == Kind::kActProjectOnto) && p.op->centre);
}

// Broadcast shape of a mask over `axis` of a tensor with `dims` dimensions.
std::vector<int64_t> Along(int64_t dims, int64_t axis, int64_t size) {
  std::vector<int64_t> shape(static_cast<size_t>(dims), 1);
  shape[static_cast<size_t>(axis)] = size;
  return shape;
}

// The edited value of one op on a chunk v [1, b, ...] of sequences starting
// at `begin`.
torch::Tensor Apply(const Prepared& p, const torch::Tensor& v, int64_t begin) {
  const int64_t b = v.size(1);
  const bool pattern = p.point.kind == HookPoint::Kind::kPattern;
  torch::Tensor mean = p.mean.defined() ? p.mean.unsqueeze(0).unsqueeze(0).to(v.scalar_type()) : torch::Tensor();
  torch::Tensor out;
  switch (p.op->kind) {
    case Kind::kActZero: out = torch::zeros_like(v); break;
    case Kind::kActMean: out = mean.expand_as(v); break;
    case Kind::kActResample: out = p.ref.index_select(0, p.perm.narrow(0, begin, b)).unsqueeze(0).to(v.scalar_type()); break;
    case Kind::kActPatch: out = p.ref.narrow(0, begin, b).unsqueeze(0).to(v.scalar_type()); break;
    case Kind::kActAdd: out = v + p.scale * p.vec.to(v.scalar_type()); break;
    case Kind::kActProjectOut:
    case Kind::kActProjectOnto: {
      torch::Tensor mu = mean.defined() ? mean : torch::zeros_like(v);
      torch::Tensor U = p.basis.to(v.scalar_type());
      torch::Tensor inside = torch::matmul(torch::matmul(v - mu, U), U.t());
      out = p.op->kind == Kind::kActProjectOut ? v - p.scale * inside : mu + inside;
      break;
    }
    default: return v;
  }
  // Only the selected rows (and heads) change.
  const int64_t pos_axis = pattern ? 3 : 2;
  torch::Tensor mask = p.rows.view(Along(v.dim(), pos_axis, p.rows.size(0)));
  if (p.heads.defined()) mask = mask & p.heads.view(Along(v.dim(), pattern ? 2 : 3, p.heads.size(0)));
  return torch::where(mask, out, v);
}

// Hook activations at `name` for tokens [n, T], [n, ...] on the CPU.
torch::Tensor Capture(const DecoderModel& model, const torch::Tensor& tokens, const std::string& name) {
  std::vector<torch::Tensor> parts;
  HookFn capture = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
    if (point == name) parts.push_back(v.squeeze(0));
    return {};
  };
  for (int64_t b = 0; b < tokens.size(0); b += kChunk) {
    model.Forward(tokens.narrow(0, b, std::min(kChunk, tokens.size(0) - b)).unsqueeze(0), &capture);
  }
  return torch::cat(parts, 0);
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
  std::vector<Prepared> ops;
  for (size_t i = 0; i < request.ops.size(); ++i) {
    const InterventionOp& op = request.ops[i];
    Prepared p;
    p.op = &op;
    p.field = "interventions[" + std::to_string(i) + "]";
    if (!op.activation()) {
      return absl::FailedPreconditionError(p.field + ": coordinate and head-ablation ops edit IMIR weights; a "
                                           "decoder run takes the hook-point ops OP_ZERO .. OP_PATCH");
    }
    absl::StatusOr<HookPoint> hp = ParseHookPoint(op.hook, cfg.layers);
    if (!hp.ok()) return absl::InvalidArgumentError(p.field + ".hook: " + std::string(hp.status().message()));
    if (hp->kind == HookPoint::Kind::kLogits) {
      return absl::InvalidArgumentError(p.field + ".hook: logits is read, not edited; edit an earlier point");
    }
    p.point = *hp;
    p.name = op.hook;
    const bool pattern = hp->kind == HookPoint::Kind::kPattern, head = hp->kind == HookPoint::Kind::kHead;
    const Kind k = op.kind;
    if (pattern && (k == Kind::kActAdd || k == Kind::kActProjectOut || k == Kind::kActProjectOnto)) {
      return absl::InvalidArgumentError(p.field + ": attention patterns take OP_ZERO, OP_MEAN, OP_RESAMPLE or "
                                        "OP_PATCH only");
    }
    if (pattern || head) {
      if (op.head < 0 || op.head > cfg.heads) {
        return absl::InvalidArgumentError(p.field + ".head must be in [0, " + std::to_string(cfg.heads) +
                                          "] (0 = every head), got " + std::to_string(op.head));
      }
      if (op.head > 0) p.heads = torch::arange(cfg.heads) == (op.head - 1);
    } else if (op.head != 0) {
      return absl::InvalidArgumentError(p.field + ".head applies to attn.head and attn.pattern points only");
    }
    p.rows = torch::zeros({T}, torch::kBool);
    if (op.positions.empty()) p.rows.fill_(true);
    for (int64_t pos : op.positions) {
      if (pos < 0 || pos >= T) {
        return absl::InvalidArgumentError(p.field + ".positions must be in [0, " + std::to_string(T - 1) + "], got " +
                                          std::to_string(pos));
      }
      p.rows[pos] = true;
    }
    const int64_t width = head ? cfg.d_model / cfg.heads : cfg.d_model;
    for (size_t v = 0; v < op.vectors.size(); ++v) {
      if (static_cast<int64_t>(op.vectors[v].size()) != width) {
        return absl::InvalidArgumentError(p.field + ".vectors[" + std::to_string(v) + "] has " +
                                          std::to_string(op.vectors[v].size()) + " values; hook " + op.hook +
                                          " has width " + std::to_string(width));
      }
      for (double x : op.vectors[v]) {
        if (!std::isfinite(x)) return absl::InvalidArgumentError(p.field + ".vectors must be finite");
      }
    }
    p.scale = op.scale == 0 ? 1.0 : op.scale;
    if (k == Kind::kActAdd) {
      if (op.vectors.size() != 1) return absl::InvalidArgumentError(p.field + ": OP_ADD takes exactly one vector");
      p.vec = torch::tensor(op.vectors[0], torch::kDouble);
    }
    if (k == Kind::kActProjectOut || k == Kind::kActProjectOnto) {
      if (op.vectors.empty()) return absl::InvalidArgumentError(p.field + ": projections need at least one vector");
      std::vector<torch::Tensor> cols;
      for (const auto& v : op.vectors) cols.push_back(torch::tensor(v, torch::kDouble));
      auto [U, S, Vh] = torch::linalg_svd(torch::stack(cols, 1), false);
      const double top = S.max().item<double>();
      if (!(top > 0)) return absl::InvalidArgumentError(p.field + ".vectors span nothing (all zero)");
      p.basis = U.narrow(1, 0, (S > 1e-6 * top).sum().item<int64_t>());
    }
    if (!op.reference_set.empty() && find_set(op.reference_set) < 0) {
      return absl::InvalidArgumentError(p.field + ".reference_set must be one of " + set_names + ", got '" +
                                        op.reference_set + "'");
    }
    ops.push_back(std::move(p));
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
    for (Prepared& p : ops) {
      p.ref = p.mean = p.perm = torch::Tensor();
      if (!NeedsReference(p)) continue;
      const int ri = p.op->reference_set.empty() ? si : find_set(p.op->reference_set);
      p.ref = Capture(model, draw(ri, "intervene/reference"), p.name);
      p.mean = p.ref.mean(0);
      torch::Generator gen = MakeGenerator(DeriveSeed63(request.seed, "intervene/resample", static_cast<uint64_t>(si)));
      p.perm = torch::randperm(n, gen, torch::kLong);
    }
    double loss_clean = 0, loss = 0, acc_clean = 0, acc = 0, kl = 0;
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t count = std::min(kChunk, n - b);
      torch::Tensor chunk = tokens.narrow(0, b, count).unsqueeze(0);
      HookFn edit = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
        torch::Tensor x = v;
        bool changed = false;
        for (const Prepared& p : ops) {
          if (p.name != point) continue;
          x = Apply(p, x, b);
          changed = true;
        }
        return changed ? x : torch::Tensor();
      };
      torch::Tensor clean = model.Forward(chunk), edited = model.Forward(chunk, &edit);
      loss_clean += NextTokenLoss(clean, chunk).sum().item<double>();
      loss += NextTokenLoss(edited, chunk).sum().item<double>();
      torch::Tensor next = chunk.narrow(2, 1, T - 1);
      acc_clean += (clean.narrow(2, 0, T - 1).argmax(-1) == next).to(torch::kDouble).mean(2).sum().item<double>();
      acc += (edited.narrow(2, 0, T - 1).argmax(-1) == next).to(torch::kDouble).mean(2).sum().item<double>();
      torch::Tensor lc = torch::log_softmax(clean.narrow(2, 0, T - 1).to(torch::kDouble), -1);
      torch::Tensor le = torch::log_softmax(edited.narrow(2, 0, T - 1).to(torch::kDouble), -1);
      kl += (lc.exp() * (lc - le)).sum(-1).mean(2).sum().item<double>();
    }
    EffectReport e;
    e.eval_set = sets[static_cast<size_t>(si)].first;
    const double dn = static_cast<double>(n);
    e.loss_clean = loss_clean / dn;
    e.loss = loss / dn;
    e.accuracy_clean = acc_clean / dn;
    e.accuracy = acc / dn;
    e.kl_clean = kl / dn;
    report.effects.push_back(e);
  }
  return report;
}

}  // namespace circuitlab::engine
