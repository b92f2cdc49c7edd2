#include "server/engine/analysis/circuits.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "server/common/seeds.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/train/trainer.h"

namespace circuitlab::engine {
namespace {

constexpr int64_t kChunk = 1024;

// A checkpoint opened for analysis: the task, dense copies of the weights,
// and their coordinates over `basis`.
struct Opened {
  std::unique_ptr<BlockTask> task;
  std::unique_ptr<ImirModel> dense;  // FULL, one member
  Basis basis;
  std::unique_ptr<Projector> projector;
  std::vector<double> values;  // coordinates of `dense` over `basis`
  bool coordinate_model = false;
  int64_t layers = 0, heads = 0;
};

std::unique_ptr<ImirModel> DenseLike(const BlockTask& task, int64_t layers, int64_t heads) {
  return std::make_unique<ImirModel>(DenseConfig(task.vocab_size(), task.num_positions(), layers, heads), 1,
                                     torch::kCPU);
}

// Copies member 0 of `model` (either parameterisation) into `dense`.
void CopyDense(const ImirModel& model, ImirModel& dense) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> kq;
  for (int64_t l = 0; l < model.config().layers; ++l) kq.push_back(model.kq(l)[0].detach());
  dense.AssignDense(0, kq, model.readout()[0].detach());
}

absl::StatusOr<Opened> Open(const v1::ExperimentSpec& spec, const std::string& checkpoint, Selection selection) {
  Opened o;
  const auto& m = spec.model().imir();
  o.layers = m.num_layers();
  o.heads = m.num_heads();
  o.task = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
  std::unique_ptr<ImirModel> model = MakeModel(spec, *o.task, 1, torch::kCPU);
  if (absl::Status s = LoadWeights(checkpoint, *model); !s.ok()) return s;
  o.coordinate_model = model->coordinate_model();
  o.basis = o.coordinate_model ? model->config().coordinates->basis
                               : BuildBasis(o.task->Symmetry(), o.layers, o.heads, selection);
  o.dense = DenseLike(*o.task, o.layers, o.heads);
  CopyDense(*model, *o.dense);
  o.projector = std::make_unique<Projector>(o.basis);
  o.values = o.projector->Project(*o.dense, 0).values;
  return o;
}

struct EvalData {
  std::string name, alt_name;
  torch::Tensor tokens, pids, target, alt_target;  // [1, B, T] / [B]
};

absl::StatusOr<EvalData> MakeEval(const BlockTask& task, const std::string& name, int64_t n, uint64_t seed) {
  std::string have;
  for (const EvalSetInfo& info : task.EvalSets()) {
    have += (have.empty() ? "" : ", ") + info.name;
    if (info.name != name) continue;
    torch::Generator gen = MakeGenerator(EvalSeed(seed, info.mode));
    Batch b = task.Sample(n, info.mode, gen);
    return EvalData{info.name, info.alt_name, b.tokens.unsqueeze(0), b.pids.unsqueeze(0), b.target, b.alt_target};
  }
  return absl::InvalidArgumentError("evaluation set '" + name + "' is not one of this task's (" + have + ")");
}

// Logits at the query [B, V] (float64), in chunks; with `attention`, the
// query's attention row per layer [H, B, T].
torch::Tensor Logits(const ImirModel& model, const EvalData& d, std::vector<torch::Tensor>* attention = nullptr) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  std::vector<std::vector<torch::Tensor>> attn;
  const int64_t B = d.tokens.size(1);
  for (int64_t b = 0; b < B; b += kChunk) {
    const int64_t n = std::min(kChunk, B - b);
    std::vector<torch::Tensor> a;
    out.push_back(model.Forward(d.tokens.narrow(1, b, n), d.pids.narrow(1, b, n), false,
                                attention != nullptr ? &a : nullptr)[0]
                      .to(torch::kDouble));
    if (attention != nullptr) attn.push_back(std::move(a));
  }
  if (attention != nullptr) {
    attention->clear();
    for (size_t l = 0; l < attn.front().size(); ++l) {
      std::vector<torch::Tensor> parts;
      for (const auto& chunk : attn) parts.push_back(chunk[l][0]);
      attention->push_back(torch::cat(parts, 1).to(torch::kDouble));  // [H, B, T]
    }
  }
  return torch::cat(out, 0);
}

// Logits at the query [B, V] (float64) with the activation edits `ops`
// applied, in chunks; `meters` (when given) record attention mass.
torch::Tensor EditedLogits(const ImirModel& model, const EvalData& d, const std::vector<PreparedOp>& ops,
                           std::vector<AttentionMassMeter>* meters = nullptr) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  const int64_t B = d.tokens.size(1);
  for (int64_t b = 0; b < B; b += kChunk) {
    const int64_t n = std::min(kChunk, B - b);
    const HookFn edit = EditHook(ops, b);
    const HookFn metered = meters != nullptr ? MeteredHook(&edit, *meters) : HookFn();
    out.push_back(model.Forward(d.tokens.narrow(1, b, n), d.pids.narrow(1, b, n), false, nullptr,
                                meters != nullptr ? &metered : &edit)[0]
                      .to(torch::kDouble));
  }
  return torch::cat(out, 0);
}

// The tensor at an IMIR hook point (imir_model.h; layers and heads from 1).
absl::StatusOr<HookGeometry> ImirHookGeometry(const std::string& name, int64_t layers, int64_t heads, int64_t d0) {
  const std::string allowed = "embed, L{l}.attn, L{l}.H{h}.out or L{l}.resid with l in [1, " + std::to_string(layers) +
                              "] and h in [1, " + std::to_string(heads) + "]";
  HookGeometry g;
  g.name = name;
  if (name == "embed") {
    g.width = d0;
    return g;
  }
  if (name == "logits") return absl::InvalidArgumentError("logits is read, not edited; edit an earlier point");
  auto number = [](const std::string& text, size_t from, size_t to) -> int64_t {
    if (to <= from || to - from > 4) return -1;
    int64_t v = 0;
    for (size_t i = from; i < to; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(text[i]))) return -1;
      v = v * 10 + (text[i] - '0');
    }
    return v;
  };
  const size_t dot = name.find('.');
  const int64_t l = name.size() > 1 && name[0] == 'L' && dot != std::string::npos ? number(name, 1, dot) : -1;
  if (l < 1 || l > layers) return absl::InvalidArgumentError("hook point '" + name + "' is not one of " + allowed);
  const std::string rest = name.substr(dot + 1);
  int64_t below = d0;  // d_{l-1}
  for (int64_t i = 1; i < l; ++i) below *= heads + 1;
  if (rest == "attn") {  // [E, H, B, T, T]
    g.batch_axis = 2;
    g.pos_axis = 3;
    g.head_axis = 1;
    g.heads = heads;
    g.pattern = true;
    return g;
  }
  if (rest == "resid") {
    g.width = below * (heads + 1);
    return g;
  }
  const size_t out = rest.find(".out");
  const int64_t h = rest.size() > 5 && rest[0] == 'H' && out != std::string::npos && out + 4 == rest.size()
                        ? number(rest, 1, out)
                        : -1;
  if (h < 1 || h > heads) return absl::InvalidArgumentError("hook point '" + name + "' is not one of " + allowed);
  g.width = below;
  return g;
}

double Accuracy(const torch::Tensor& logits, const torch::Tensor& target) {
  return logits.argmax(-1).eq(target).to(torch::kDouble).mean().item<double>();
}

double Loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return -torch::log_softmax(logits, -1).gather(1, target.unsqueeze(1)).mean().item<double>();
}

double MetricOf(CircuitMetric metric, const torch::Tensor& logits, const torch::Tensor& target) {
  switch (metric) {
    case CircuitMetric::kAccuracy: return Accuracy(logits, target);
    case CircuitMetric::kLoss: return Loss(logits, target);
    case CircuitMetric::kPTarget:
      return torch::softmax(logits, -1).gather(1, target.unsqueeze(1)).mean().item<double>();
  }
  return 0;
}

// Loads W_S(c) into `target`.
void LoadCoords(const Opened& o, const std::vector<double>& c, ImirModel& target) {
  Projection p;
  p.values = c;
  o.projector->LoadProjected(p, target, 0);
}

// W + W_S(after) - W_S(before) over `projector`'s basis: the dense weights
// with their coordinates moved from `before` to `after`, the off-manifold
// part kept.
std::unique_ptr<ImirModel> MovedCoords(const Opened& o, const Projector& projector, const std::vector<double>& before,
                                       const std::vector<double>& after) {
  std::vector<double> delta(after.size());
  for (size_t i = 0; i < after.size(); ++i) delta[i] = after[i] - before[i];
  Projection p;
  p.values = std::move(delta);
  std::unique_ptr<ImirModel> moved = DenseLike(*o.task, o.layers, o.heads);
  projector.LoadProjected(p, *moved, 0);
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < o.layers; ++l) moved->kq(l).add_(o.dense->kq(l));
  moved->readout().add_(o.dense->readout());
  return moved;
}

// The block written by head h (1-based) of layer i (1-based), as a path name.
std::string HeadBlock(int64_t i, int64_t h, int64_t layers, int64_t heads) {
  int64_t index = h;
  for (int64_t l = 1; l < i; ++l) index *= heads + 1;
  return PathName(index, i, layers, heads);
}

std::string KqLabel(int64_t layer, int64_t head, const std::string& q, const std::string& k, const std::string& e) {
  return "L" + std::to_string(layer) + "H" + std::to_string(head) + ":[" + q + "→" + k + "]:" + e;
}

std::string OutLabel(const std::string& block, const std::string& e) { return "OUT:[" + block + "]:" + e; }

// Zeroes, in `model`, every weight block that reads the output of head
// (layer, head) or a copy of it: KQ rows/columns of later layers and readout
// columns of blocks whose path passes through that head.
void AblateHead(ImirModel& model, int64_t layer, int64_t head) {
  torch::NoGradGuard no_grad;
  const int64_t d0 = model.d0(), H = model.config().heads, L = model.config().layers;
  int64_t stride = 1;  // (H+1)^(layer-1)
  for (int64_t l = 1; l < layer; ++l) stride *= H + 1;
  auto through = [&](int64_t block) { return (block / stride) % (H + 1) == head; };
  for (int64_t m = layer + 1; m <= L; ++m) {
    torch::Tensor w = model.kq(m - 1);  // [1, H, d, d] writable
    const int64_t blocks = w.size(-1) / d0;
    for (int64_t b = 0; b < blocks; ++b) {
      if (!through(b)) continue;
      w.narrow(2, b * d0, d0).zero_();
      w.narrow(3, b * d0, d0).zero_();
    }
  }
  torch::Tensor r = model.readout();  // [1, V, d_L]
  const int64_t blocks = r.size(-1) / d0;
  for (int64_t b = 0; b < blocks; ++b) {
    if (through(b)) r.narrow(2, b * d0, d0).zero_();
  }
}

int32_t Find(const Basis& basis, const std::string& name) { return FindCoordinate(basis, name); }

double Magnitude(const Basis& basis, const std::vector<double>& c, const std::string& label) {
  const int32_t id = Find(basis, label);
  return id < 0 ? 0.0 : std::abs(c[static_cast<size_t>(id)]) * basis.coords[static_cast<size_t>(id)].norm;
}

bool IsTwoHop(const v1::ExperimentSpec& spec) {
  return spec.task().has_k_hop() && spec.task().k_hop().hops() == 2;
}

// Candidate templates for the task and model: each a name, its layers and its
// element labels (roles: canonical; the 2-hop shortcut is listed apart).
struct Template {
  std::string name;
  std::vector<int> layers;
  std::vector<std::string> elements;
  std::string shortcut;  // 2-hop: OUT reading the middle head
};

std::vector<Template> Templates(const v1::ExperimentSpec& spec, int64_t L, int64_t H) {
  std::vector<Template> out;
  for (int64_t i = 1; i <= L; ++i) {
    for (int64_t hi = 1; hi <= H; ++hi) {
      const std::string bi = HeadBlock(i, hi, L, H);
      for (int64_t j = i + 1; j <= L; ++j) {
        for (int64_t hj = 1; hj <= H; ++hj) {
          const std::string bj = HeadBlock(j, hj, L, H);
          const std::string prev = KqLabel(i, hi, "∅", "∅", "S_1");
          const std::string match = KqLabel(j, hj, "∅", bi, "I_t");
          if (!IsTwoHop(spec)) {
            out.push_back({"induction_head", {static_cast<int>(i), static_cast<int>(j)},
                           {prev, match, OutLabel(bj, "I")}, ""});
            continue;
          }
          for (int64_t k = j + 1; k <= L; ++k) {
            for (int64_t hk = 1; hk <= H; ++hk) {
              const std::string bk = HeadBlock(k, hk, L, H);
              out.push_back({"two_hop_chain",
                             {static_cast<int>(i), static_cast<int>(j), static_cast<int>(k)},
                             {prev, match, KqLabel(k, hk, bj, bi, "I_t"), OutLabel(bk, "I")},
                             OutLabel(bj, "I")});
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

std::string PrimaryEvalSet(const v1::ExperimentSpec& spec) {
  if (spec.task().has_associative_recall() || spec.task().kind_case() == v1::TaskSpec::KIND_NOT_SET) {
    return "icl_rare";
  }
  return MakeBlockTask(spec, PoolSeedOf(spec.seed()))->EvalSets().front().name;
}

absl::StatusOr<DetectReport> DetectCircuitImpl(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                               const DetectRequest& req,
                                               const std::function<void(double)>& progress,
                                               const CancelToken* cancel) {
  at::set_num_threads(1);
  absl::StatusOr<Opened> opened = Open(spec, checkpoint, req.selection);
  if (!opened.ok()) return opened.status();
  Opened& o = *opened;
  DetectReport report;
  report.eval_set = req.eval_set.empty() ? PrimaryEvalSet(spec) : req.eval_set;
  absl::StatusOr<EvalData> data = MakeEval(*o.task, report.eval_set, req.n_eval, req.seed);
  if (!data.ok()) return data.status();
  const bool lower_better = req.metric == CircuitMetric::kLoss;
  std::unique_ptr<ImirModel> scratch = DenseLike(*o.task, o.layers, o.heads);

  int64_t evals = 0;
  auto metric_of = [&](const std::vector<double>& c) {
    ++evals;
    LoadCoords(o, c, *scratch);
    return MetricOf(req.metric, Logits(*scratch, *data), data->target);
  };
  auto stopped = [&] { return cancel != nullptr && cancel->stop_requested(); };

  // Gauge directions never change the function: drop them first.
  std::vector<double> c = o.values;
  for (const CoordinateDef& d : o.basis.coords) {
    if (d.gauge) c[static_cast<size_t>(d.index)] = 0;
  }
  report.m_dense = MetricOf(req.metric, Logits(*o.dense, *data), data->target);
  report.m_ref = metric_of(c);
  report.projection_not_faithful = std::abs(report.m_dense - report.m_ref) > 0.05;
  const double m_ref = report.m_ref;
  auto good = [&](double m) { return lower_better ? m <= m_ref + req.tolerance : m >= m_ref - req.tolerance; };
  auto mag = [&](size_t a) { return std::abs(c[a]) * o.basis.coords[a].norm; };

  std::vector<size_t> active;
  for (size_t a = 0; a < c.size(); ++a) {
    if (c[a] != 0) active.push_back(a);
  }
  report.candidates = static_cast<int64_t>(active.size());
  const double estimate = static_cast<double>(std::min<int64_t>(req.max_evals, report.candidates * 2 + 4));
  auto report_progress = [&] {
    if (progress) progress(std::min(0.99, static_cast<double>(evals) / estimate));
  };

  // Prepass: bulk-drop the tiny coordinates.
  double max_mag = 0;
  for (size_t a : active) max_mag = std::max(max_mag, mag(a));
  if (req.prepass_eps > 0 && max_mag > 0) {
    std::vector<double> trial = c;
    bool any = false;
    for (size_t a : active) {
      if (mag(a) < req.prepass_eps * max_mag) {
        trial[a] = 0;
        any = true;
      }
    }
    if (any && good(metric_of(trial))) c = trial;
  }

  // Greedy passes.
  for (int pass = 0; pass < req.max_passes && !report.budget_exhausted; ++pass) {
    std::vector<size_t> order;
    for (size_t a = 0; a < c.size(); ++a) {
      if (c[a] != 0) order.push_back(a);
    }
    if (req.order == DetectRequest::Order::kMagnitudeAsc) {
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return mag(x) < mag(y); });
    } else if (req.order == DetectRequest::Order::kLabel) {
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t x, size_t y) { return o.basis.coords[x].label < o.basis.coords[y].label; });
    } else {
      std::map<size_t, double> damage;
      for (size_t a : order) {
        if (evals >= req.max_evals) break;
        std::vector<double> trial = c;
        trial[a] = 0;
        const double m = metric_of(trial);
        damage[a] = lower_better ? m - m_ref : m_ref - m;
        if (stopped()) return absl::CancelledError("circuit detection stopped");
      }
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return damage[x] < damage[y]; });
    }
    bool changed = false;
    for (size_t a : order) {
      if (evals >= req.max_evals) {
        report.budget_exhausted = true;
        break;
      }
      std::vector<double> trial = c;
      trial[a] = 0;
      if (good(metric_of(trial))) {
        c = trial;
        changed = true;
      }
      report_progress();
      if (stopped()) return absl::CancelledError("circuit detection stopped");
    }
    if (!changed) break;
  }

  // K*, necessity, roles.
  report.m_circuit = metric_of(c);
  std::vector<size_t> kept;
  for (size_t a = 0; a < c.size(); ++a) {
    if (c[a] != 0) kept.push_back(a);
  }
  std::sort(kept.begin(), kept.end(), [&](size_t x, size_t y) { return mag(x) > mag(y); });
  std::set<std::string> in_circuit;
  for (size_t a : kept) in_circuit.insert(o.basis.coords[a].label);

  // Recognise a template: the candidate with the most elements in K* (all
  // of them for a match), smallest layers first.
  const std::vector<Template> templates = Templates(spec, o.layers, o.heads);
  const Template* best = nullptr;
  int best_found = -1;
  for (const Template& t : templates) {
    int found = 0;
    for (const std::string& e : t.elements) found += in_circuit.count(e) ? 1 : 0;
    if (found > best_found) {
      best = &t;
      best_found = found;
    }
  }
  std::set<std::string> canonical, shortcut;
  const std::string iwl = OutLabel("∅", "C");
  if (best != nullptr) {
    const bool complete = best_found == static_cast<int>(best->elements.size());
    for (const std::string& e : best->elements) {
      const int32_t id = Find(o.basis, e);
      report.template_elements.push_back(
          {e, id >= 0 ? o.basis.coords[static_cast<size_t>(id)].canonical : "", in_circuit.count(e) > 0});
      if (complete) canonical.insert(e);
    }
    if (complete) {
      report.template_name = best->name;
      report.template_layers = best->layers;
      if (!best->shortcut.empty()) shortcut.insert(best->shortcut);
    }
  }
  if (in_circuit.count(iwl)) {
    canonical.insert(iwl);
    report.template_name += report.template_name.empty() ? "in_weights_memory" : "+in_weights_memory";
  }

  // Attention diagnostics: R_l = the key each sequence's query attends to
  // most under K*; irrelevant mass = 1 - attention on it.
  std::vector<torch::Tensor> attn_k;
  LoadCoords(o, c, *scratch);
  Logits(*scratch, *data, &attn_k);
  std::vector<torch::Tensor> focus;
  for (const torch::Tensor& a : attn_k) {
    focus.push_back(a.argmax(-1, true));  // [H, B, 1]
    report.irrelevant_mass.push_back(1.0 - a.gather(-1, focus.back()).mean().item<double>());
  }
  for (size_t a : kept) {
    CircuitMember member;
    member.def = o.basis.coords[a];
    member.value = c[a];
    std::vector<double> trial = c;
    trial[a] = 0;
    std::vector<torch::Tensor> attn;
    LoadCoords(o, trial, *scratch);
    ++evals;
    const double m = MetricOf(req.metric, Logits(*scratch, *data, &attn), data->target);
    member.necessity = lower_better ? m - report.m_circuit : report.m_circuit - m;
    member.role = canonical.count(member.def.label) ? "canonical" : shortcut.count(member.def.label) ? "shortcut"
                                                                                                     : "aiding";
    if (member.role == "aiding") {
      for (size_t l = 0; l < attn.size(); ++l) {
        const double irr = 1.0 - attn[l].gather(-1, focus[l]).mean().item<double>();
        member.irrelevant_mass_delta.push_back(irr - report.irrelevant_mass[l]);
      }
    }
    report.circuit.push_back(std::move(member));
    if (stopped()) return absl::CancelledError("circuit detection stopped");
  }
  report.evaluations = evals;
  if (progress) progress(1.0);
  return report;
}

absl::StatusOr<InterveneReport> InterveneImpl(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                              const InterveneRequest& req) {
  at::set_num_threads(1);
  absl::StatusOr<Opened> opened = Open(spec, checkpoint, req.selection);
  if (!opened.ok()) return opened.status();
  Opened& o = *opened;
  std::vector<double> c = o.values;
  std::vector<std::pair<int64_t, int64_t>> ablated;  // (layer, head)
  std::vector<PreparedOp> activations;  // hook-point edits, applied on top of the weight edits
  for (size_t i = 0; i < req.ops.size(); ++i) {
    const InterventionOp& op = req.ops[i];
    const std::string field = "interventions[" + std::to_string(i) + "]";
    std::vector<int32_t> ids;
    for (size_t k = 0; k < op.coordinates.size(); ++k) {
      const int32_t id = Find(o.basis, op.coordinates[k]);
      if (id < 0) {
        return absl::InvalidArgumentError(field + ".coordinates[" + std::to_string(k) + "] '" + op.coordinates[k] +
                                          "' is not a coordinate of the " + SelectionName(o.basis.selection) +
                                          " basis of this run (" + std::to_string(o.basis.coords.size()) +
                                          " coordinates; list them with `circuitlab project`)");
      }
      ids.push_back(id);
    }
    switch (op.kind) {
      case InterventionOp::Kind::kZero:
      case InterventionOp::Kind::kScale:
      case InterventionOp::Kind::kSet:
        if (ids.empty()) return absl::InvalidArgumentError(field + ".coordinates must name at least one coordinate");
        for (int32_t id : ids) {
          double& v = c[static_cast<size_t>(id)];
          v = op.kind == InterventionOp::Kind::kZero ? 0.0 : op.kind == InterventionOp::Kind::kScale ? v * op.scale
                                                                                                     : op.value;
        }
        break;
      case InterventionOp::Kind::kActReplaceConvex:
        return absl::FailedPreconditionError(field + ": OP_REPLACE_CONVEX steers a decoder run along its task "
                                             "vectors; an IMIR run has none");
      case InterventionOp::Kind::kActZero:
      case InterventionOp::Kind::kActMean:
      case InterventionOp::Kind::kActResample:
      case InterventionOp::Kind::kActProjectOut:
      case InterventionOp::Kind::kActProjectOnto:
      case InterventionOp::Kind::kActAdd:
      case InterventionOp::Kind::kActPatch: {
        absl::StatusOr<HookGeometry> g = ImirHookGeometry(op.hook, o.layers, o.heads, o.task->vocab_size() +
                                                                                         o.task->num_positions());
        if (!g.ok()) return absl::InvalidArgumentError(field + ".hook: " + std::string(g.status().message()));
        absl::StatusOr<PreparedOp> p = PrepareActivationOp(op, field, *g, o.task->seq_len());
        if (!p.ok()) return p.status();
        activations.push_back(std::move(*p));
        break;
      }
      case InterventionOp::Kind::kKeepOnly: {
        if (ids.empty()) return absl::InvalidArgumentError(field + ".coordinates must name at least one coordinate");
        std::vector<double> kept(c.size(), 0.0);
        for (int32_t id : ids) kept[static_cast<size_t>(id)] = c[static_cast<size_t>(id)];
        c = kept;
        break;
      }
      case InterventionOp::Kind::kAblateHead:
        if (op.layer < 1 || op.layer > o.layers) {
          return absl::InvalidArgumentError(field + ".layer must be in [1, " + std::to_string(o.layers) + "], got " +
                                            std::to_string(op.layer));
        }
        if (op.head < 1 || op.head > o.heads) {
          return absl::InvalidArgumentError(field + ".head must be in [1, " + std::to_string(o.heads) + "], got " +
                                            std::to_string(op.head));
        }
        ablated.emplace_back(op.layer, op.head);
        break;
      case InterventionOp::Kind::kSwap: {
        const auto& sm = op.source_spec.model().imir();
        std::unique_ptr<BlockTask> stask = MakeBlockTask(op.source_spec, PoolSeedOf(op.source_spec.seed()));
        if (stask->vocab_size() != o.task->vocab_size() || stask->num_positions() != o.task->num_positions() ||
            static_cast<int64_t>(sm.num_layers()) != o.layers || static_cast<int64_t>(sm.num_heads()) != o.heads) {
          return absl::InvalidArgumentError(field + ".source_run_id: its model has another shape (vocabulary, "
                                            "positions, layers or heads) than this run's");
        }
        std::unique_ptr<ImirModel> smodel = MakeModel(op.source_spec, *stask, 1, torch::kCPU);
        if (absl::Status s = LoadWeights(op.source_checkpoint, *smodel); !s.ok()) return s;
        std::unique_ptr<ImirModel> sdense = DenseLike(*o.task, o.layers, o.heads);
        CopyDense(*smodel, *sdense);
        const std::vector<double> src = o.projector->Project(*sdense, 0).values;
        if (ids.empty()) {
          c = src;
        } else {
          for (int32_t id : ids) c[static_cast<size_t>(id)] = src[static_cast<size_t>(id)];
        }
        break;
      }
    }
  }

  // W' = W + W_S(c') - W_S(c), then the head ablations.
  std::unique_ptr<ImirModel> edited = MovedCoords(o, *o.projector, o.values, c);
  for (const auto& [layer, head] : ablated) AblateHead(*edited, layer, head);

  if (absl::Status s = CheckLogitDiffTokens(req.logit_diff_tokens, o.task->vocab_size()); !s.ok()) return s;
  // D.6 attention_mass at the query unless other queries are named.
  const int64_t T = o.task->seq_len();
  std::vector<AttentionMassMeter> meters;
  for (size_t i = 0; i < req.attention_mass.size(); ++i) {
    const std::string field = "attention_mass[" + std::to_string(i) + "]";
    absl::StatusOr<HookGeometry> g = ImirHookGeometry(req.attention_mass[i].pattern, o.layers, o.heads,
                                                      o.task->vocab_size() + o.task->num_positions());
    if (!g.ok()) return absl::InvalidArgumentError(field + ".pattern: " + std::string(g.status().message()));
    absl::StatusOr<AttentionMassMeter> m = PrepareAttentionMass(req.attention_mass[i], field, *g, T, {T - 1});
    if (!m.ok()) return m.status();
    meters.push_back(std::move(*m));
  }

  InterveneReport report;
  for (const CoordinateDef& d : o.basis.coords) {
    const double before = o.values[static_cast<size_t>(d.index)], after = c[static_cast<size_t>(d.index)];
    if (before != after) report.edited.push_back({d, before, after});
  }
  std::vector<std::string> sets = req.eval_sets;
  if (sets.empty()) {
    for (const EvalSetInfo& info : o.task->EvalSets()) sets.push_back(info.name);
  }
  for (const PreparedOp& p : activations) {
    if (p.op->reference_set.empty()) continue;
    if (absl::StatusOr<EvalData> probe = MakeEval(*o.task, p.op->reference_set, 1, req.seed); !probe.ok()) {
      return absl::InvalidArgumentError(p.field + ".reference_set: " + std::string(probe.status().message()));
    }
  }
  for (size_t i = 0; i < sets.size(); ++i) {
    absl::StatusOr<EvalData> data = MakeEval(*o.task, sets[i], req.n_eval, req.seed);
    if (!data.ok()) {
      return absl::InvalidArgumentError("eval_sets[" + std::to_string(i) + "]: " +
                                        std::string(data.status().message()));
    }
    // Reference activations come from the weight-edited model on sequences
    // drawn with another seed (the evaluated set unless reference_set).
    std::map<std::string, EvalData> drawn;  // reference sequences, shared by the ops that read the same set
    for (PreparedOp& p : activations) {
      p.ref = p.mean = p.perm = torch::Tensor();
      if (!NeedsReference(p)) continue;
      const std::string ref_name = p.op->reference_set.empty() ? data->name : p.op->reference_set;
      auto ref = drawn.find(ref_name);
      if (ref == drawn.end()) {
        absl::StatusOr<EvalData> d = MakeEval(*o.task, ref_name, req.n_eval, DeriveSeed63(req.seed, "intervene/reference"));
        if (!d.ok()) return d.status();
        ref = drawn.emplace(ref_name, std::move(*d)).first;
      }
      absl::Status s = CaptureReference(
          p, req.n_eval, kChunk, o.task->seq_len(), DeriveSeed63(req.seed, "intervene/resample", i),
          [&](int64_t b, int64_t count, const HookFn& hook) {
            torch::NoGradGuard no_grad;
            edited->Forward(ref->second.tokens.narrow(1, b, count), ref->second.pids.narrow(1, b, count), false, nullptr, &hook);
          });
      if (!s.ok()) return s;
    }
    std::vector<AttentionMassMeter> clean_mass = FreshCopies(meters), hit_mass = FreshCopies(meters);
    const torch::Tensor clean = meters.empty() ? Logits(*o.dense, *data) : EditedLogits(*o.dense, *data, {}, &clean_mass);
    const torch::Tensor hit = activations.empty() && meters.empty()
                                  ? Logits(*edited, *data)
                                  : EditedLogits(*edited, *data, activations, meters.empty() ? nullptr : &hit_mass);
    EffectReport e;
    ReportMass(clean_mass, hit_mass, e);
    e.eval_set = data->name;
    e.loss_clean = Loss(clean, data->target);
    e.loss = Loss(hit, data->target);
    e.accuracy_clean = Accuracy(clean, data->target);
    e.accuracy = Accuracy(hit, data->target);
    const torch::Tensor lp_clean = torch::log_softmax(clean, -1), lp_hit = torch::log_softmax(hit, -1);
    e.kl_clean = (lp_clean.exp() * (lp_clean - lp_hit)).sum(-1).mean().item<double>();
    e.has_logit_diff = !data->alt_name.empty() || data->name == "conflict";
    if (!req.logit_diff_tokens.empty()) {  // the request's pair instead of the task's
      e.has_logit_diff = true;
      e.alt_name = LogitDiffName(req.logit_diff_tokens);
      auto ld = [&](const torch::Tensor& logits) {
        return (logits.select(1, req.logit_diff_tokens[0]) - logits.select(1, req.logit_diff_tokens[1]))
            .mean()
            .item<double>();
      };
      e.logit_diff_clean = ld(clean);
      e.logit_diff = ld(hit);
    } else if (e.has_logit_diff) {
      e.alt_name = data->alt_name.empty() ? "in_weights" : data->alt_name;
      auto ld = [&](const torch::Tensor& logits) {
        return (logits.gather(1, data->target.unsqueeze(1)) - logits.gather(1, data->alt_target.unsqueeze(1)))
            .mean()
            .item<double>();
      };
      e.logit_diff_clean = ld(clean);
      e.logit_diff = ld(hit);
    }
    report.effects.push_back(std::move(e));
  }
  return report;
}

// A candidate layer pair of D.3 (head 1): previous-token head at layer i,
// induction head at j > i, named "i-j", with the labels of its three
// coordinates prev_i, match_ij, out_j.
struct LayerPair {
  std::string name, prev, match, out;
};

std::vector<LayerPair> LayerPairs(int64_t L, int64_t H) {
  std::vector<LayerPair> pairs;
  for (int64_t i = 1; i <= L; ++i) {
    for (int64_t j = i + 1; j <= L; ++j) {
      pairs.push_back({std::to_string(i) + "-" + std::to_string(j), KqLabel(i, 1, "∅", "∅", "S_1"),
                       KqLabel(j, 1, "∅", HeadBlock(i, 1, L, H), "I_t"), OutLabel(HeadBlock(j, 1, L, H), "I")});
    }
  }
  return pairs;
}

// D.3's winning pair, refined for redundant circuits [P]. Candidate pair
// (i, j) owns one coordinate, its match; prev_i and out_j are shared with
// other pairs. Zeroing the match coordinates of a set
// of pairs (W - sum c_k B_k, the rest of the weights kept) removes exactly
// those paths. The label is the smallest set whose removal takes away at
// least half of the accuracy above chance: "2-3", or "1-3+2-3" when two
// pairs cover for each other (removing either alone leaves the other); among
// sets of that size the one removing most, MIXED when another removes at
// least 90% as much, OTHER when no set of up to three pairs does (the
// behaviour lives outside the candidate paths). Every set tried is reported
// in `ablation` with the share it removes.
// `scores` are the pairs' |prev| |match| |out|, in the order of `pairs`.
std::string PathLabel(const Opened& o, const Projector& projector, const Basis& paper, const std::vector<double>& c,
                      const std::vector<LayerPair>& pairs, const std::vector<std::pair<std::string, double>>& scores,
                      const EvalData& d, double acc, double chance,
                      std::vector<std::pair<std::string, double>>& ablation) {
  struct Candidate {
    std::string name;
    double score;
    int32_t match;
  };
  std::vector<Candidate> candidates;
  double top = 0;
  for (const auto& [name, s] : scores) top = std::max(top, s);
  for (size_t k = 0; k < pairs.size(); ++k) {
    const int32_t match = Find(paper, pairs[k].match);
    if (match >= 0 && scores[k].second > 1e-3 * top) candidates.push_back({pairs[k].name, scores[k].second, match});
  }
  // At most six candidates (the largest scores): 41 subsets of up to three.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  if (candidates.size() > 6) candidates.resize(6);
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.name < b.name; });
  const int n = static_cast<int>(candidates.size());
  for (int size = 1; size <= std::min(3, n); ++size) {
    std::vector<std::pair<double, std::string>> qualified;
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      if (std::popcount(mask) != size) continue;
      std::vector<double> cut = c;
      std::string name;
      for (int k = 0; k < n; ++k) {
        if (!(mask & (1u << k))) continue;
        cut[static_cast<size_t>(candidates[static_cast<size_t>(k)].match)] = 0.0;
        name += (name.empty() ? "" : "+") + candidates[static_cast<size_t>(k)].name;
      }
      const std::unique_ptr<ImirModel> model = MovedCoords(o, projector, c, cut);
      const double after = Accuracy(Logits(*model, d), d.target);
      const double removed = acc - chance > 1e-9 ? std::clamp((acc - after) / (acc - chance), 0.0, 1.0) : 0.0;
      ablation.emplace_back(name, removed);
      if (removed >= 0.5) qualified.emplace_back(removed, name);
    }
    if (qualified.empty()) continue;
    std::sort(qualified.rbegin(), qualified.rend());
    return qualified.size() >= 2 && qualified[1].first >= 0.9 * qualified[0].first ? "MIXED" : qualified[0].second;
  }
  return "OTHER";
}

absl::StatusOr<LabelReport> LabelRunImpl(const v1::ExperimentSpec& spec,
                                         const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                         const LabelRequest& req, const std::function<void(double)>& progress,
                                         const CancelToken* cancel) {
  at::set_num_threads(1);
  if (checkpoints.empty()) return absl::FailedPreconditionError("the run has no checkpoint yet");
  const auto& m = spec.model().imir();
  const int64_t L = m.num_layers(), H = m.num_heads();
  const std::unique_ptr<BlockTask> task = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
  std::set<std::string> sets;
  for (const EvalSetInfo& info : task->EvalSets()) sets.insert(info.name);
  const bool coordinate_model = m.parameterisation() == v1::PARAMETERISATION_COORDINATES;
  const std::string primary = PrimaryEvalSet(spec);
  // SCIENCE.md G.5: coordinate models are labelled ICL by icl_holdout, dense
  // one-hot models by icl_rare (their held-out rows never train). The paper
  // basis's I_t leaves held-out tokens out as well (G.5), so only coordinate
  // models over the complete basis can answer icl_holdout.
  const bool holdout = coordinate_model && m.coordinate_basis() == v1::BASIS_SELECTION_COMPLETE;
  const std::string icl_set = holdout && sets.count("icl_holdout") ? "icl_holdout" : primary;
  std::map<std::string, EvalData> data;
  for (const std::string& name : {icl_set, primary, std::string("iwl"), std::string("conflict")}) {
    if (!sets.count(name) || data.count(name)) continue;
    absl::StatusOr<EvalData> d = MakeEval(*task, name, req.n_eval, req.seed);
    if (!d.ok()) return d.status();
    data.emplace(name, std::move(*d));
  }
  const Basis paper = BuildBasis(task->Symmetry(), L, H, Selection::kPaper);
  const Projector projector(paper);

  // Pair scores |prev_i| |match_ij| |out_j| for every layer pair (head 1).
  const std::vector<LayerPair> pairs = LayerPairs(L, H);
  auto pair_scores = [&](const std::vector<double>& c) {
    std::vector<std::pair<std::string, double>> out;
    for (const LayerPair& p : pairs) {
      out.emplace_back(p.name, Magnitude(paper, c, p.prev) * Magnitude(paper, c, p.match) * Magnitude(paper, c, p.out));
    }
    return out;
  };
  auto value_of = [&](const std::vector<double>& c, const char* canonical) {
    const int32_t id = Find(paper, canonical);
    return id < 0 ? 0.0 : c[static_cast<size_t>(id)];
  };

  LabelReport report;
  std::vector<std::array<double, 4>> abgd;  // alpha, beta, gamma, delta per checkpoint
  const double chance = 1.0 / static_cast<double>(task->vocab_size());
  for (size_t k = 0; k < checkpoints.size(); ++k) {
    absl::StatusOr<Opened> o = Open(spec, checkpoints[k].second, Selection::kPaper);
    if (!o.ok()) return o.status();
    // Open projected onto the paper basis already unless the run's own
    // coordinate basis is the complete one.
    const std::vector<double> c =
        o->basis.selection == Selection::kPaper ? o->values : projector.Project(*o->dense, 0).values;
    CheckpointLabelReport r;
    r.step = checkpoints[k].first;
    r.icl_set = icl_set;
    r.icl_accuracy = Accuracy(Logits(*o->dense, data.at(icl_set)), data.at(icl_set).target);
    r.icl = r.icl_accuracy >= 0.5;
    if (data.count("iwl")) {
      r.iwl_accuracy = Accuracy(Logits(*o->dense, data.at("iwl")), data.at("iwl").target);
      r.iwl = r.iwl_accuracy >= 0.5;
    }
    if (data.count("conflict")) {
      const EvalData& d = data.at("conflict");
      const torch::Tensor logits = Logits(*o->dense, d);
      r.conflict_logit_diff =
          (logits.gather(1, d.target.unsqueeze(1)) - logits.gather(1, d.alt_target.unsqueeze(1))).mean().item<double>();
    }
    abgd.push_back({value_of(c, "alpha"), value_of(c, "beta"), value_of(c, "gamma"), value_of(c, "delta")});
    if (L >= 2) {
      const EvalData& d = data.at(primary);
      const double acc = Accuracy(Logits(*o->dense, d), d.target);
      for (int64_t l = 1; l <= L; ++l) {
        std::unique_ptr<ImirModel> ablated = DenseLike(*task, L, H);
        CopyDense(*o->dense, *ablated);
        for (int64_t h = 1; h <= H; ++h) AblateHead(*ablated, l, h);
        const double after = Accuracy(Logits(*ablated, d), d.target);
        r.head_ablation.push_back(acc - chance > 1e-9 ? std::clamp((acc - after) / (acc - chance), 0.0, 1.0) : 0.0);
      }
      r.pair_scores = pair_scores(c);
      if (acc < 0.5) {
        r.pair = "NONE";
      } else {
        r.pair = PathLabel(*o, projector, paper, c, pairs, r.pair_scores, d, acc, chance, r.pair_ablation);
      }
    }
    report.checkpoints.push_back(std::move(r));
    if (progress) progress(static_cast<double>(k + 1) / static_cast<double>(checkpoints.size() + 1));
    if (cancel != nullptr && cancel->stop_requested()) return absl::CancelledError("labelling stopped");
  }
  // Coordinates against their run maximum (D.2).
  std::array<double, 4> peak = {0, 0, 0, 0};
  for (const auto& v : abgd) {
    for (size_t i = 0; i < 4; ++i) peak[i] = std::max(peak[i], v[i]);
  }
  auto grown = [&](const std::array<double, 4>& v, size_t i) { return peak[i] > 0 && v[i] >= 0.1 * peak[i]; };
  bool was_icl = false;
  for (size_t k = 0; k < report.checkpoints.size(); ++k) {
    CheckpointLabelReport& r = report.checkpoints[k];
    r.coords_icl = grown(abgd[k], 0) && grown(abgd[k], 1) && grown(abgd[k], 2);
    r.coords_iwl = grown(abgd[k], 3);
    r.consistent = r.icl == r.coords_icl && r.iwl == r.coords_iwl;
    r.label = r.icl && r.iwl ? (r.conflict_logit_diff > 0 ? "BOTH_ICL_WINS" : "BOTH_IWL_WINS")
              : r.icl        ? "ICL_ONLY"
              : r.iwl        ? "IWL_ONLY"
                             : "NEITHER";
    if (k + 1 < report.checkpoints.size()) was_icl = was_icl || r.icl;
  }
  const CheckpointLabelReport& last = report.checkpoints.back();
  report.label = was_icl && !last.icl ? "TRANSIENT_ICL" : last.label;
  report.pair = last.pair;

  // The magnitude-only predictor: pair scores of the initial weights.
  if (L >= 2) {
    std::unique_ptr<ImirModel> init = MakeModel(spec, *task, 1, torch::kCPU);
    InitializeModel(spec, {spec.seed()}, *init);
    std::unique_ptr<ImirModel> dense = DenseLike(*task, L, H);
    CopyDense(*init, *dense);
    const auto scores = pair_scores(projector.Project(*dense, 0).values);
    const auto best = std::max_element(scores.begin(), scores.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    report.pair_predicted = best->second > 0 ? best->first : "NONE";
  }
  if (progress) progress(1.0);
  return report;
}

}  // namespace circuitlab::engine
