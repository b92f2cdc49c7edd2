#include "server/engine/analysis/imir_eval.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "server/common/seeds.h"
#include "server/engine/setup/imir_setup.h"

namespace circuitlab::engine {

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

absl::StatusOr<DenseCheckpoint> OpenDense(const v1::ExperimentSpec& spec, const std::string& checkpoint) {
  DenseCheckpoint d;
  d.task = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
  std::unique_ptr<ImirModel> model = MakeModel(spec, *d.task, 1, torch::kCPU);
  if (absl::Status s = LoadWeights(checkpoint, *model); !s.ok()) return s;
  d.dense = DenseLike(*d.task, spec.model().imir().num_layers(), spec.model().imir().num_heads());
  CopyDense(*model, *d.dense);
  return d;
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
  o.values = Project(*o.projector, *o.dense, 0).values;
  return o;
}

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
torch::Tensor Logits(const ImirModel& model, const EvalData& d, std::vector<torch::Tensor>* attention) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  std::vector<std::vector<torch::Tensor>> attn;
  const int64_t B = d.tokens.size(1);
  for (int64_t b = 0; b < B; b += kImirChunk) {
    const int64_t n = std::min(kImirChunk, B - b);
    std::vector<torch::Tensor> a;
    out.push_back(
        model.Forward(d.tokens.narrow(1, b, n), d.pids.narrow(1, b, n), false, attention != nullptr ? &a : nullptr)[0]
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
                           std::vector<AttentionMassMeter>* meters) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  const int64_t B = d.tokens.size(1);
  for (int64_t b = 0; b < B; b += kImirChunk) {
    const int64_t n = std::min(kImirChunk, B - b);
    const HookFn edit = EditHook(ops, b);
    const HookFn metered = meters != nullptr ? MeteredHook(&edit, *meters) : HookFn();
    out.push_back(model
                      .Forward(d.tokens.narrow(1, b, n), d.pids.narrow(1, b, n), false, nullptr,
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

// Loads W_S(c) into `target`.
void LoadCoords(const Opened& o, const std::vector<double>& c, ImirModel& target) {
  Projection p;
  p.values = c;
  LoadProjected(*o.projector, p, target, 0);
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
  LoadProjected(projector, p, *moved, 0);
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
  return absl::StrCat("L", layer, "H", head, ":[", q, "→", k, "]:", e);
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

double Magnitude(const Basis& basis, const std::vector<double>& c, const std::string& label) {
  const int32_t id = FindCoordinate(basis, label);
  return id < 0 ? 0.0 : std::abs(c[static_cast<size_t>(id)]) * basis.coords[static_cast<size_t>(id)].norm;
}

std::string PrimaryEvalSet(const v1::ExperimentSpec& spec) {
  if (spec.task().has_associative_recall() || spec.task().kind_case() == v1::TaskSpec::KIND_NOT_SET) {
    return "icl_rare";
  }
  return MakeBlockTask(spec, PoolSeedOf(spec.seed()))->EvalSets().front().name;
}

void FillCoordinate(const CoordinateDef& d, double value, v1::Coordinate* out) {
  out->set_label(d.label);
  out->set_canonical(d.canonical);
  out->set_matrix(d.matrix);
  out->set_layer(static_cast<uint32_t>(d.layer));
  out->set_head(static_cast<uint32_t>(d.head));
  out->set_block_q(d.block_q);
  out->set_block_k(d.block_k);
  out->set_element(d.element);
  out->set_value(value);
  out->set_magnitude(value * d.norm);
  out->set_gauge(d.gauge);
}

}  // namespace circuitlab::engine
