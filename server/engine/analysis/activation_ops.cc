#include "server/engine/analysis/activation_ops.h"

#include <cmath>

#include "server/engine/setup/checkpoint_io.h"

namespace circuitlab::engine {
namespace {

using Op = v1::Intervention;

// Broadcast shape of a mask over `axis` of a tensor with `dims` dimensions.
std::vector<int64_t> Along(int64_t dims, int64_t axis, int64_t size) {
  std::vector<int64_t> shape(static_cast<size_t>(dims), 1);
  shape[static_cast<size_t>(axis)] = size;
  return shape;
}

torch::Tensor Vector(const v1::HookVector& v) {
  return torch::tensor(std::vector<double>(v.values().begin(), v.values().end()), torch::kDouble);
}

torch::Tensor ApplyOne(const PreparedOp& p, const torch::Tensor& v, int64_t begin) {
  const int64_t b = v.size(p.geo.batch_axis), ax = p.geo.batch_axis - 1;  // the axis in ref (no ensemble axis)
  torch::Tensor mean = p.mean.defined() ? p.mean.unsqueeze(ax).unsqueeze(0).to(v.scalar_type()) : torch::Tensor();
  torch::Tensor out;
  switch (p.op->op()) {
    case Op::OP_ZERO:
      out = torch::zeros_like(v);
      break;
    case Op::OP_MEAN:
      out = mean.expand_as(v);
      break;
    case Op::OP_RESAMPLE:
      out = p.ref.index_select(ax, p.perm.narrow(0, begin, b)).unsqueeze(0).to(v.scalar_type());
      break;
    case Op::OP_PATCH:
      out = p.ref.narrow(ax, begin, b).unsqueeze(0).to(v.scalar_type());
      break;
    case Op::OP_ADD:
      out = v + p.scale * p.vec.to(v.scalar_type());
      break;
    case Op::OP_REPLACE_CONVEX:
      if (p.delta.defined()) {
        out = v + p.delta.narrow(0, begin, b).unsqueeze(0).to(v.scalar_type());
      } else {
        torch::Tensor P = p.projector.to(v.scalar_type());
        torch::Tensor goal = p.target.narrow(0, begin, b).unsqueeze(1).unsqueeze(0).to(v.scalar_type());
        out = v - torch::matmul(v - mean, P) + goal;
      }
      break;
    case Op::OP_PROJECT_OUT:
    case Op::OP_PROJECT_ONTO: {
      torch::Tensor mu = mean.defined() ? mean : torch::zeros_like(v);
      torch::Tensor U = p.basis.to(v.scalar_type());
      torch::Tensor inside = torch::matmul(torch::matmul(v - mu, U), U.t());
      out = p.op->op() == Op::OP_PROJECT_OUT ? v - p.scale * inside : mu + inside;
      break;
    }
    default: return v;
  }
  torch::Tensor mask = p.rows.to(v.device()).view(Along(v.dim(), p.geo.pos_axis, p.rows.size(0)));
  if (p.heads.defined()) mask = mask & p.heads.to(v.device()).view(Along(v.dim(), p.geo.head_axis, p.heads.size(0)));
  return torch::where(mask, out, v);
}

}  // namespace

absl::StatusOr<AttentionMassMeter> PrepareAttentionMass(const v1::AttentionMass& spec, const std::string& field,
                                                        const HookGeometry& geo, int64_t T,
                                                        const std::vector<int64_t>& default_queries,
                                                        const std::vector<int64_t>& answer) {
  if (!geo.pattern) {
    return absl::InvalidArgumentError(field + ".pattern: '" + geo.name + "' is not an attention pattern");
  }
  if (spec.keys().empty() || spec.keys_size() > T) {
    return absl::InvalidArgumentError(field + ".keys must have 1 to " + std::to_string(T) + " entries, got " +
                                      std::to_string(spec.keys_size()));
  }
  if (spec.queries_size() > T) {
    return absl::InvalidArgumentError(field + ".queries must have at most " + std::to_string(T) + " entries");
  }
  for (int i = 0; i < spec.keys_size(); ++i) {
    if (spec.keys(i) < -T || spec.keys(i) >= T) {
      return absl::InvalidArgumentError(field + ".keys[" + std::to_string(i) + "] must be in [" + std::to_string(-T) +
                                        ", " + std::to_string(T - 1) + "], got " + std::to_string(spec.keys(i)));
    }
  }
  for (int i = 0; i < spec.queries_size(); ++i) {
    if (spec.queries(i) < 0 || spec.queries(i) >= T) {
      return absl::InvalidArgumentError(field + ".queries[" + std::to_string(i) + "] must be in [0, " +
                                        std::to_string(T - 1) + "], got " + std::to_string(spec.queries(i)));
    }
  }
  if (!spec.queries().empty() && spec.query_mask() != v1::POSITION_MASK_UNSPECIFIED) {
    return absl::InvalidArgumentError(field + ": give queries or query_mask, not both");
  }
  if (!v1::PositionMask_IsValid(spec.query_mask())) {
    return absl::InvalidArgumentError(field + ".query_mask must be POSITION_MASK_ANSWER or POSITION_MASK_ALL, got " +
                                      std::to_string(spec.query_mask()));
  }
  AttentionMassMeter m;
  m.geo_ = geo;
  m.mask_ = torch::zeros({T, T}, torch::kDouble);
  auto mask = m.mask_.accessor<double, 2>();
  std::vector<bool> query_rows(static_cast<size_t>(T), false);
  if (spec.queries().empty()) {
    const std::vector<int64_t> rows = spec.query_mask() == v1::POSITION_MASK_UNSPECIFIED
                                          ? default_queries
                                          : MaskPositions(spec.query_mask(), T, answer);
    for (int64_t q : rows) query_rows[static_cast<size_t>(q)] = true;
  }
  for (int64_t q : spec.queries()) query_rows[static_cast<size_t>(q)] = true;
  // A query counts when it sees at least one of the keys (causal: later
  // keys carry no mass; the previous position of query 0 does not exist).
  for (int64_t q = 0; q < T; ++q) {
    if (!query_rows[static_cast<size_t>(q)]) continue;
    bool sees = false;
    for (int64_t k : spec.keys()) {
      const int64_t key = k >= 0 ? k : q + k;
      if (key >= 0 && key <= q) mask[q][key] = 1.0, sees = true;
    }
    m.queries_ += sees;
  }
  if (m.queries_ == 0) {
    return absl::InvalidArgumentError(field + ": no query sees any of the keys (a key must be at or before its "
                                      "query)");
  }
  m.Reset();
  return m;
}

void AttentionMassMeter::Reset() {
  sums_ = torch::zeros({mask_.size(0), geo_.heads}, torch::kDouble);
  rows_ = 0;
}

void AttentionMassMeter::Add(const torch::Tensor& pattern) {
  torch::NoGradGuard no_grad;
  const int64_t T = mask_.size(0);
  // Keys summed: the head and batch axes, then the query axis last.
  torch::Tensor mass = (pattern.to(torch::kDouble) * mask_.to(pattern.device())).sum(-1);
  mass = mass.movedim(geo_.head_axis, 0).reshape({geo_.heads, -1, T}).cpu();  // [heads, rows, T]
  sums_ += mass.sum(1).t();
  rows_ += mass.size(1);
}

std::vector<double> AttentionMassMeter::PerHead() const {
  std::vector<double> out(static_cast<size_t>(geo_.heads), 0.0);
  if (rows_ == 0 || queries_ == 0) return out;
  const torch::Tensor total = sums_.sum(0);
  for (int64_t h = 0; h < geo_.heads; ++h) {
    out[static_cast<size_t>(h)] = total[h].item<double>() / static_cast<double>(rows_ * queries_);
  }
  return out;
}

std::vector<int64_t> AttentionMassMeter::Queries() const {
  std::vector<int64_t> out;
  const torch::Tensor counted = mask_.sum(1) > 0;
  for (int64_t q = 0; q < mask_.size(0); ++q) {
    if (counted[q].item<bool>()) out.push_back(q);
  }
  return out;
}

std::vector<double> AttentionMassMeter::PerQuery() const {
  std::vector<double> out;
  for (int64_t q : Queries()) {
    for (int64_t h = 0; h < geo_.heads; ++h) {
      out.push_back(rows_ == 0 ? 0.0 : sums_[q][h].item<double>() / static_cast<double>(rows_));
    }
  }
  return out;
}

std::vector<AttentionMassMeter> FreshCopies(const std::vector<AttentionMassMeter>& meters) {
  std::vector<AttentionMassMeter> out = meters;
  for (AttentionMassMeter& m : out) m.Reset();
  return out;
}

absl::Status CheckLogitDiffTokens(const google::protobuf::RepeatedField<uint32_t>& tokens, int64_t vocab) {
  if (!tokens.empty() && tokens.size() != 2) {
    return absl::InvalidArgumentError("logit_diff_tokens must be empty or two token ids (t1, t2), got " +
                                      std::to_string(tokens.size()));
  }
  for (int i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab) {
      return absl::InvalidArgumentError("logit_diff_tokens[" + std::to_string(i) + "] must be in [0, " +
                                        std::to_string(vocab - 1) + "], got " + std::to_string(tokens[i]));
    }
  }
  return absl::OkStatus();
}

std::string LogitDiffName(const google::protobuf::RepeatedField<uint32_t>& tokens) {
  return "tokens " + std::to_string(tokens[0]) + "-" + std::to_string(tokens[1]);
}

void ReportMass(const std::vector<AttentionMassMeter>& clean, const std::vector<AttentionMassMeter>& hit,
                bool per_query, v1::InterventionEffect& e) {
  for (size_t k = 0; k < clean.size(); ++k) {
    v1::AttentionMassEffect* a = e.add_attention_mass();
    a->set_pattern(clean[k].pattern());
    const std::vector<double> c = clean[k].PerHead(), h = hit[k].PerHead();
    a->mutable_clean()->Add(c.begin(), c.end());
    a->mutable_intervened()->Add(h.begin(), h.end());
    if (!per_query) continue;
    for (int64_t q : clean[k].Queries()) a->add_queries(static_cast<uint32_t>(q));
    const std::vector<double> cq = clean[k].PerQuery(), hq = hit[k].PerQuery();
    a->mutable_clean_by_query()->Add(cq.begin(), cq.end());
    a->mutable_intervened_by_query()->Add(hq.begin(), hq.end());
  }
}

HookFn MeteredHook(const HookFn* inner, std::vector<AttentionMassMeter>& meters) {
  return [inner, &meters](const std::string& point, const torch::Tensor& value) {
    torch::Tensor out = inner != nullptr ? (*inner)(point, value) : torch::Tensor();
    for (AttentionMassMeter& m : meters) {
      if (m.pattern() == point) m.Add(out.defined() ? out : value);
    }
    return out;
  };
}

bool NeedsReference(const PreparedOp& p) {
  const Op::Op k = p.op->op();
  return k == Op::OP_MEAN || k == Op::OP_RESAMPLE || k == Op::OP_PATCH || k == Op::OP_REPLACE_CONVEX ||
         ((k == Op::OP_PROJECT_OUT || k == Op::OP_PROJECT_ONTO) && p.op->centre());
}

absl::StatusOr<PreparedOp> PrepareActivationOp(const v1::Intervention& op, const std::string& field,
                                               const HookGeometry& geo, int64_t T) {
  PreparedOp p;
  p.op = &op;
  p.field = field;
  p.geo = geo;
  const Op::Op k = op.op();
  if (geo.pattern &&
      (k == Op::OP_ADD || k == Op::OP_PROJECT_OUT || k == Op::OP_PROJECT_ONTO || k == Op::OP_REPLACE_CONVEX)) {
    return absl::InvalidArgumentError(field + ": attention patterns take OP_ZERO, OP_MEAN, OP_RESAMPLE or "
                                      "OP_PATCH only");
  }
  if (geo.head_axis >= 0) {
    if (op.head() > geo.heads) {
      return absl::InvalidArgumentError(field + ".head must be in [0, " + std::to_string(geo.heads) +
                                        "] (0 = every head), got " + std::to_string(op.head()));
    }
    if (op.head() > 0) p.heads = torch::arange(geo.heads) == (static_cast<int64_t>(op.head()) - 1);
  } else if (op.head() != 0) {
    return absl::InvalidArgumentError(field + ".head applies to points with a head axis only (hook " + geo.name +
                                      " has none)");
  }
  p.rows = torch::zeros({T}, torch::kBool);
  if (op.positions().empty()) p.rows.fill_(true);
  for (int64_t pos : op.positions()) {
    if (pos >= T) {
      return absl::InvalidArgumentError(field + ".positions must be in [0, " + std::to_string(T - 1) + "], got " +
                                        std::to_string(pos));
    }
    p.rows[pos] = true;
  }
  for (int v = 0; v < op.vectors_size(); ++v) {
    if (op.vectors(v).values_size() != geo.width) {
      return absl::InvalidArgumentError(field + ".vectors[" + std::to_string(v) + "] has " +
                                        std::to_string(op.vectors(v).values_size()) + " values; hook " + geo.name +
                                        " has width " + std::to_string(geo.width));
    }
    for (double x : op.vectors(v).values()) {
      if (!std::isfinite(x)) return absl::InvalidArgumentError(field + ".vectors must be finite");
    }
  }
  p.scale = op.scale() == 0 ? 1.0 : op.scale();
  if (k == Op::OP_ADD) {
    if (op.vectors_size() != 1) return absl::InvalidArgumentError(field + ": OP_ADD takes exactly one vector");
    p.vec = Vector(op.vectors(0));
  }
  if (k == Op::OP_PROJECT_OUT || k == Op::OP_PROJECT_ONTO) {
    if (op.vectors().empty()) return absl::InvalidArgumentError(field + ": projections need at least one vector");
    std::vector<torch::Tensor> cols;
    for (const v1::HookVector& v : op.vectors()) cols.push_back(Vector(v));
    auto [U, S, Vh] = torch::linalg_svd(torch::stack(cols, 1), false);
    const double top = S.max().item<double>();
    if (!(top > 0)) return absl::InvalidArgumentError(field + ".vectors span nothing (all zero)");
    p.basis = U.narrow(1, 0, (S > 1e-6 * top).sum().item<int64_t>());
  }
  return p;
}

absl::Status CaptureReference(PreparedOp& p, int64_t n, int64_t chunk, int64_t T, uint64_t perm_seed,
                              const std::function<void(int64_t, int64_t, const HookFn&)>& forward) {
  std::vector<torch::Tensor> parts;
  HookFn capture = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
    if (point == p.geo.name) parts.push_back(v.squeeze(0).cpu());
    return {};
  };
  for (int64_t b = 0; b < n; b += chunk) forward(b, std::min(chunk, n - b), capture);
  const int64_t ax = p.geo.batch_axis - 1;
  p.ref = torch::cat(parts, ax);
  if (p.ref.size(p.geo.pos_axis - 1) != T) {
    return absl::InvalidArgumentError(p.field + ".reference_set has sequences of " +
                                      std::to_string(p.ref.size(p.geo.pos_axis - 1)) +
                                      " positions; the evaluated set has " + std::to_string(T));
  }
  p.mean = p.ref.mean(ax);
  torch::Generator gen = MakeGenerator(perm_seed);
  p.perm = torch::randperm(n, gen, torch::kLong);
  return absl::OkStatus();
}

HookFn EditHook(const std::vector<PreparedOp>& ops, int64_t begin) {
  return [&ops, begin](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
    torch::Tensor x = v;
    bool changed = false;
    for (const PreparedOp& p : ops) {
      if (p.geo.name != point) continue;
      x = ApplyOne(p, x, begin);
      changed = true;
    }
    return changed ? x : torch::Tensor();
  };
}

std::vector<int64_t> MaskPositions(v1::PositionMask mask, int64_t T, const std::vector<int64_t>& answer) {
  if (mask == v1::POSITION_MASK_ANSWER) return answer;
  std::vector<int64_t> every(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) every[static_cast<size_t>(t)] = t;
  return every;
}

absl::StatusOr<PatchPlan> PreparePatchSweep(
    const v1::PatchSweep& sweep, const std::function<absl::StatusOr<HookGeometry>(const std::string&)>& geometry,
    int64_t T, const std::vector<int64_t>& answer) {
  if (sweep.hooks().empty() || sweep.hooks_size() > 16) {
    return absl::InvalidArgumentError("patch.hooks must have 1 to 16 entries, got " +
                                      std::to_string(sweep.hooks_size()));
  }
  if (!sweep.positions().empty() && sweep.mask() != v1::POSITION_MASK_UNSPECIFIED) {
    return absl::InvalidArgumentError("patch: give positions or mask, not both");
  }
  if (!v1::PositionMask_IsValid(sweep.mask())) {
    return absl::InvalidArgumentError("patch.mask must be POSITION_MASK_ANSWER or POSITION_MASK_ALL, got " +
                                      std::to_string(sweep.mask()));
  }
  std::vector<int64_t> positions(sweep.positions().begin(), sweep.positions().end());
  if (positions.empty()) {
    positions =
        MaskPositions(sweep.mask() == v1::POSITION_MASK_UNSPECIFIED ? v1::POSITION_MASK_ALL : sweep.mask(), T, answer);
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] >= T) {
      return absl::InvalidArgumentError("patch.positions[" + std::to_string(i) + "] must be in [0, " +
                                        std::to_string(T - 1) + "], got " + std::to_string(positions[i]));
    }
  }
  PatchPlan plan;
  for (int h = 0; h < sweep.hooks_size(); ++h) {
    const std::string field = "patch.hooks[" + std::to_string(h) + "]";
    absl::StatusOr<HookGeometry> g = geometry(sweep.hooks(h));
    if (!g.ok()) return absl::InvalidArgumentError(field + ": " + std::string(g.status().message()));
    for (size_t k = 0; k <= positions.size(); ++k) {
      v1::Intervention& op = plan.ops.emplace_back();
      op.set_op(v1::Intervention::OP_PATCH);
      op.set_hook(sweep.hooks(h));
      op.set_head(sweep.head());
      op.set_reference_set(sweep.reference_set());
      if (k < positions.size()) {
        op.add_positions(static_cast<uint32_t>(positions[k]));
      } else {
        for (int64_t pos : positions) op.add_positions(static_cast<uint32_t>(pos));
      }
      absl::StatusOr<PreparedOp> p = PrepareActivationOp(op, field, *g, T);
      if (!p.ok()) return absl::InvalidArgumentError("patch" + std::string(p.status().message()).substr(field.size()));
      plan.sites.push_back(std::move(*p));
      plan.positions.push_back(k < positions.size() ? static_cast<int32_t>(positions[k]) : -1);
    }
  }
  return plan;
}

absl::Status RunPatchSweep(PatchPlan& plan, int64_t n, int64_t chunk, int64_t T,
                           const std::function<void(int64_t, int64_t, const HookFn&)>& forward, const PatchScores& base,
                           const PatchScores& source,
                           const std::function<PatchScores(const std::vector<PreparedOp>&)>& patched,
                           v1::InterventionEffect& e) {
  e.set_patch_source_loss(source.loss);
  e.set_patch_source_accuracy(source.accuracy);
  e.set_patch_source_logit_diff(source.logit_diff);
  auto effect = [](double m, double b, double s) { return std::abs(s - b) < 1e-9 ? 0.0 : (m - b) / (s - b); };
  torch::Tensor hook_ref;  // one hook's source activations at a time, shared by its sites
  std::string hook;
  for (size_t i = 0; i < plan.sites.size(); ++i) {
    PreparedOp& site = plan.sites[i];
    if (!hook_ref.defined() || hook != site.geo.name) {
      hook_ref = torch::Tensor();
      if (absl::Status s = CaptureReference(site, n, chunk, T, 0, forward); !s.ok()) return s;
      hook_ref = site.ref;
      hook = site.geo.name;
      site.mean = site.perm = torch::Tensor();
    }
    site.ref = hook_ref;
    const PatchScores m = patched({site});
    site.ref = torch::Tensor();
    v1::PatchSite* out = e.add_patch();
    out->set_hook(site.geo.name);
    out->set_position(plan.positions[i]);
    out->set_loss(m.loss);
    out->set_accuracy(m.accuracy);
    out->set_logit_diff(m.logit_diff);
    out->set_effect_loss(effect(m.loss, base.loss, source.loss));
    out->set_effect_accuracy(effect(m.accuracy, base.accuracy, source.accuracy));
    out->set_effect_logit_diff(effect(m.logit_diff, base.logit_diff, source.logit_diff));
  }
  return absl::OkStatus();
}

}  // namespace circuitlab::engine
