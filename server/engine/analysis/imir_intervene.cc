// Interventions on one IMIR checkpoint (SCIENCE.md D.6): coordinate edits,
// head ablations and coordinate swaps move the weights; hook-point ops edit
// activations on top; every evaluation set is measured clean against
// intervened on the same sequences.
#include <map>
#include <optional>

#include "server/common/seeds.h"
#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/analysis/prompts.h"
#include "server/engine/setup/imir_setup.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

using Op = v1::Intervention;

// The weight-space edits of a request: the coordinates after them, the heads
// ablated, and the hook-point ops to apply on top.
struct WeightEdits {
  std::vector<double> c;
  std::vector<std::pair<int64_t, int64_t>> ablated;  // (layer, head)
  std::vector<PreparedOp> activations;
};

// The source checkpoint's coordinates over `o`'s basis (OP_SWAP_COORDINATES).
absl::StatusOr<std::vector<double>> SwapSource(const Opened& o, const StoredCheckpoint& source,
                                               const std::string& field) {
  const auto& sm = source.spec.model().imir();
  std::unique_ptr<BlockTask> stask = MakeBlockTask(source.spec, PoolSeedOf(source.spec.seed()));
  if (stask->vocab_size() != o.task->vocab_size() || stask->num_positions() != o.task->num_positions() ||
      static_cast<int64_t>(sm.num_layers()) != o.layers || static_cast<int64_t>(sm.num_heads()) != o.heads) {
    return absl::InvalidArgumentError(field +
                                      ".source_run_id: its model has another shape (vocabulary, "
                                      "positions, layers or heads) than this run's");
  }
  std::unique_ptr<ImirModel> smodel = MakeModel(source.spec, *stask, 1, torch::kCPU);
  if (absl::Status s = LoadWeights(source.bytes, *smodel); !s.ok()) return s;
  std::unique_ptr<ImirModel> sdense = DenseLike(*o.task, o.layers, o.heads);
  CopyDense(*smodel, *sdense);
  return Project(*o.projector, *sdense, 0).values;
}

// One op applied to `e` (InvalidArgument naming the op's field).
absl::Status ApplyOp(const Opened& o, const Op& op, const std::string& field, const StoredCheckpoint* source,
                     int64_t T, WeightEdits& e) {
  std::vector<int32_t> ids;
  for (int k = 0; k < op.coordinates_size(); ++k) {
    const int32_t id = FindCoordinate(o.basis, op.coordinates(k));
    if (id < 0) {
      return absl::InvalidArgumentError(field + ".coordinates[" + std::to_string(k) + "] '" + op.coordinates(k) +
                                        "' is not a coordinate of the " + SelectionName(o.basis.selection) +
                                        " basis of this run (" + std::to_string(o.basis.coords.size()) +
                                        " coordinates; list them with `circuitlab project`)");
    }
    ids.push_back(id);
  }
  const bool needs_ids = op.op() == Op::OP_ZERO_COORDINATE || op.op() == Op::OP_SCALE_COORDINATE ||
                         op.op() == Op::OP_SET_COORDINATE || op.op() == Op::OP_KEEP_ONLY;
  if (needs_ids && ids.empty()) {
    return absl::InvalidArgumentError(field + ".coordinates must name at least one coordinate");
  }
  std::vector<double>& c = e.c;
  switch (op.op()) {
    case Op::OP_ZERO_COORDINATE:
    case Op::OP_SCALE_COORDINATE:
    case Op::OP_SET_COORDINATE:
      for (int32_t id : ids) {
        double& v = c[static_cast<size_t>(id)];
        v = op.op() == Op::OP_ZERO_COORDINATE ? 0.0 : op.op() == Op::OP_SCALE_COORDINATE ? v * op.scale() : op.value();
      }
      return absl::OkStatus();
    case Op::OP_KEEP_ONLY: {
      std::vector<double> kept(c.size(), 0.0);
      for (int32_t id : ids) kept[static_cast<size_t>(id)] = c[static_cast<size_t>(id)];
      c = kept;
      return absl::OkStatus();
    }
    case Op::OP_ABLATE_HEAD: {
      const int64_t head = op.head() == 0 ? 1 : op.head();
      if (op.layer() < 1 || op.layer() > o.layers) {
        return absl::InvalidArgumentError(field + ".layer must be in [1, " + std::to_string(o.layers) + "], got " +
                                          std::to_string(op.layer()));
      }
      if (head > o.heads) {
        return absl::InvalidArgumentError(field + ".head must be in [1, " + std::to_string(o.heads) + "], got " +
                                          std::to_string(head));
      }
      e.ablated.emplace_back(op.layer(), head);
      return absl::OkStatus();
    }
    case Op::OP_SWAP_COORDINATES: {
      if (source == nullptr) return absl::InvalidArgumentError(field + ".source_run_id: no source checkpoint");
      absl::StatusOr<std::vector<double>> src = SwapSource(o, *source, field);
      if (!src.ok()) return src.status();
      if (ids.empty()) {
        c = *src;
      } else {
        for (int32_t id : ids) c[static_cast<size_t>(id)] = (*src)[static_cast<size_t>(id)];
      }
      return absl::OkStatus();
    }
    case Op::OP_REPLACE_CONVEX:
      return absl::FailedPreconditionError(field +
                                           ": OP_REPLACE_CONVEX steers a decoder run along its task "
                                           "vectors; an IMIR run has none");
    default:
      break;
  }
  if (!IsActivationOp(op.op())) {
    return absl::InvalidArgumentError(field + ".op must be one of the Intervention.Op values (got " +
                                      std::to_string(op.op()) + ")");
  }
  absl::StatusOr<HookGeometry> g =
      ImirHookGeometry(op.hook(), o.layers, o.heads, o.task->vocab_size() + o.task->num_positions());
  if (!g.ok()) return absl::InvalidArgumentError(field + ".hook: " + std::string(g.status().message()));
  absl::StatusOr<PreparedOp> p = PrepareActivationOp(op, field, *g, T);
  if (!p.ok()) return p.status();
  e.activations.push_back(std::move(*p));
  return absl::OkStatus();
}

// D.6 attention_mass meters, at the query unless other queries are named.
absl::StatusOr<std::vector<AttentionMassMeter>> MassMeters(const Opened& o, const v1::InterveneRequest& req,
                                                           int64_t T) {
  std::vector<AttentionMassMeter> meters;
  for (int i = 0; i < req.attention_mass_size(); ++i) {
    const std::string field = "attention_mass[" + std::to_string(i) + "]";
    absl::StatusOr<HookGeometry> g = ImirHookGeometry(req.attention_mass(i).pattern(), o.layers, o.heads,
                                                      o.task->vocab_size() + o.task->num_positions());
    if (!g.ok()) return absl::InvalidArgumentError(field + ".pattern: " + std::string(g.status().message()));
    absl::StatusOr<AttentionMassMeter> m = PrepareAttentionMass(req.attention_mass(i), field, *g, T, {T - 1}, {T - 1});
    if (!m.ok()) return m.status();
    meters.push_back(std::move(*m));
  }
  return meters;
}

// Reference activations of the hook-point ops for evaluated set `i`: from
// the weight-edited model on sequences drawn with another seed (the
// evaluated set unless reference_set), shared by the ops that read one set;
// on the caller's prompts, the clean prompts themselves (`own`).
absl::Status CaptureImirReferences(const Opened& o, const ImirModel& edited, const v1::InterveneRequest& req,
                                   const EvalData& data, size_t i, const EvalData* own,
                                   std::vector<PreparedOp>& activations) {
  std::map<std::string, EvalData> drawn;
  if (own != nullptr) drawn.emplace(data.name, *own);
  for (PreparedOp& p : activations) {
    p.ref = p.mean = p.perm = torch::Tensor();
    if (!NeedsReference(p)) continue;
    const std::string ref_name = p.op->reference_set().empty() ? data.name : p.op->reference_set();
    auto ref = drawn.find(ref_name);
    if (ref == drawn.end()) {
      absl::StatusOr<EvalData> d =
          MakeEval(*o.task, ref_name, req.n_eval(), DeriveSeed63(req.seed(), "intervene/reference"));
      if (!d.ok()) return d.status();
      ref = drawn.emplace(ref_name, std::move(*d)).first;
    }
    absl::Status s = CaptureReference(p, ref->second.tokens.size(1), kImirChunk, data.tokens.size(2),
                                      DeriveSeed63(req.seed(), "intervene/resample", i),
                                      [&](int64_t b, int64_t count, const HookFn& hook) {
                                        torch::NoGradGuard no_grad;
                                        edited.Forward(ref->second.tokens.narrow(1, b, count),
                                                       ref->second.pids.narrow(1, b, count), false, nullptr, &hook);
                                      });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The mean logit difference at the query: the request's token pair, else
// the set's answer minus its second answer.
double LogitDiffOf(const torch::Tensor& logits, const EvalData& d,
                   const google::protobuf::RepeatedField<uint32_t>& pair) {
  if (!pair.empty()) return (logits.select(1, pair[0]) - logits.select(1, pair[1])).mean().item<double>();
  return (logits.gather(1, d.target.unsqueeze(1)) - logits.gather(1, d.alt_target.unsqueeze(1))).mean().item<double>();
}

// Loss, accuracy and (when `diff`) the logit difference of `logits` against
// the answers of the sequences `d`.
PatchScores ScoresOf(const torch::Tensor& logits, const EvalData& d,
                     const google::protobuf::RepeatedField<uint32_t>& pair, bool diff) {
  return {Loss(logits, d.target), Accuracy(logits, d.target), diff ? LogitDiffOf(logits, d, pair) : 0.0};
}

// The clean and intervened measures of one evaluation set.
v1::InterventionEffect ImirEffect(const Opened& o, const ImirModel& edited, const v1::InterveneRequest& req,
                                  const EvalData& data, const std::vector<PreparedOp>& activations,
                                  const std::vector<AttentionMassMeter>& meters) {
  std::vector<AttentionMassMeter> clean_mass = FreshCopies(meters), hit_mass = FreshCopies(meters);
  const torch::Tensor clean = meters.empty() ? Logits(*o.dense, data) : EditedLogits(*o.dense, data, {}, &clean_mass);
  // A request without interventions (a patch sweep, a read-out of attention
  // mass) runs the unedited model once: the "intervened" run is the clean one.
  const bool unedited = req.interventions_size() == 0;
  if (unedited) hit_mass = clean_mass;
  const torch::Tensor hit = unedited ? clean
                            : activations.empty() && meters.empty()
                                ? Logits(edited, data)
                                : EditedLogits(edited, data, activations, meters.empty() ? nullptr : &hit_mass);
  v1::InterventionEffect e;
  ReportMass(clean_mass, hit_mass, req.per_position(), e);
  e.set_eval_set(data.name);
  e.set_loss_clean(Loss(clean, data.target));
  e.set_loss(Loss(hit, data.target));
  e.set_accuracy_clean(Accuracy(clean, data.target));
  e.set_accuracy(Accuracy(hit, data.target));
  const torch::Tensor lp_clean = torch::log_softmax(clean, -1), lp_hit = torch::log_softmax(hit, -1);
  e.set_kl_clean((lp_clean.exp() * (lp_clean - lp_hit)).sum(-1).mean().item<double>());
  const auto& pair = req.logit_diff_tokens();
  // The request's pair instead of the task's.
  e.set_has_logit_diff(!pair.empty() || !data.alt_name.empty() || data.name == "conflict");
  if (e.has_logit_diff()) {
    e.set_alt_name(!pair.empty() ? LogitDiffName(pair) : data.alt_name.empty() ? "in_weights" : data.alt_name);
    e.set_logit_diff_clean(LogitDiffOf(clean, data, pair));
    e.set_logit_diff(LogitDiffOf(hit, data, pair));
  }
  if (req.per_position()) {  // the block model reads out at the query only
    v1::PositionEffect* p = e.add_positions();
    p->set_position(static_cast<uint32_t>(data.tokens.size(2) - 1));
    p->set_loss_clean(e.loss_clean());
    p->set_loss(e.loss());
    p->set_accuracy_clean(e.accuracy_clean());
    p->set_accuracy(e.accuracy());
    p->set_kl_clean(e.kl_clean());
    p->set_logit_diff_clean(e.logit_diff_clean());
    p->set_logit_diff(e.logit_diff());
  }
  return e;
}

// D.6 patch_effect on one evaluated set (the unedited model): the sweep's
// sites patched one at a time from the paired source sequences.
absl::Status ImirPatch(const Opened& o, const v1::InterveneRequest& req, const EvalData& data, const EvalData* own,
                       PatchPlan& plan, v1::InterventionEffect& e) {
  const std::string source_set = req.patch().reference_set().empty() ? data.name : req.patch().reference_set();
  absl::StatusOr<EvalData> source =
      own != nullptr ? *own : MakeEval(*o.task, source_set, req.n_eval(), DeriveSeed63(req.seed(), "intervene/reference"));
  if (!source.ok()) return absl::InvalidArgumentError("patch.reference_set: " + std::string(source.status().message()));
  const auto& pair = req.logit_diff_tokens();
  const bool diff = e.has_logit_diff();
  const PatchScores base{e.loss_clean(), e.accuracy_clean(), e.logit_diff_clean()};
  const PatchScores from = ScoresOf(Logits(*o.dense, *source), data, pair, diff);
  return RunPatchSweep(
      plan, data.tokens.size(1), kImirChunk, data.tokens.size(2),
      [&](int64_t b, int64_t count, const HookFn& hook) {
        torch::NoGradGuard no_grad;
        o.dense->Forward(source->tokens.narrow(1, b, count), source->pids.narrow(1, b, count), false, nullptr, &hook);
      },
      base, from,
      [&](const std::vector<PreparedOp>& ops) { return ScoresOf(EditedLogits(*o.dense, data, ops), data, pair, diff); },
      e);
}

// Intervene's Prompts on the block model: `scored` is what the metrics read
// (the corrupted prompts under a patch sweep, else the clean ones), `clean`
// the patch's source and the ops' reference; both answer the prompts'
// answers at the query (the last position).
struct PromptData {
  EvalData scored, clean;
};
absl::StatusOr<PromptData> ImirPrompts(const Opened& o, const v1::InterveneRequest& req) {
  absl::StatusOr<PromptSet> p = ReadPrompts(req, o.task->vocab_size(), o.task->num_positions(), 0);
  if (!p.ok()) return p.status();
  auto data = [&](const Sequences& x) {
    EvalData d;
    d.name = "prompts";
    d.alt_name = p->wrong.defined() ? "wrong" : "";
    d.tokens = x.tokens;
    d.pids = x.pids;
    d.target = p->answers;
    d.alt_target = p->wrong.defined() ? p->wrong : p->answers;
    return d;
  };
  return PromptData{data(req.has_patch() ? p->corrupted : p->clean), data(p->clean)};
}

}  // namespace

absl::StatusOr<v1::InterveneResponse> ImirIntervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                    const v1::InterveneRequest& req,
                                                    const std::map<int, StoredCheckpoint>& swap_sources) {
  at::set_num_threads(1);
  absl::StatusOr<Opened> opened = Open(spec, checkpoint, SelectionOf(req.selection()));
  if (!opened.ok()) return opened.status();
  Opened& o = *opened;
  std::optional<PromptData> prompts;
  if (req.has_prompts()) {
    absl::StatusOr<PromptData> p = ImirPrompts(o, req);
    if (!p.ok()) return p.status();
    prompts = std::move(*p);
  }
  const int64_t T = prompts ? prompts->scored.tokens.size(2) : o.task->seq_len();
  WeightEdits edits{o.values, {}, {}};
  for (int i = 0; i < req.interventions_size(); ++i) {
    const auto source = swap_sources.find(i);
    absl::Status s = ApplyOp(o, req.interventions(i), "interventions[" + std::to_string(i) + "]",
                             source == swap_sources.end() ? nullptr : &source->second, T, edits);
    if (!s.ok()) return s;
  }
  // W' = W + W_S(c') - W_S(c), then the head ablations; without weight
  // edits (activation ops only, or none) the opened model itself.
  std::unique_ptr<ImirModel> moved;
  const ImirModel* edited = o.dense.get();
  if (edits.c != o.values || !edits.ablated.empty()) {
    moved = MovedCoords(o, *o.projector, o.values, edits.c);
    for (const auto& [layer, head] : edits.ablated) AblateHead(*moved, layer, head);
    edited = moved.get();
  }

  if (absl::Status s = CheckLogitDiffTokens(req.logit_diff_tokens(), o.task->vocab_size()); !s.ok()) return s;
  absl::StatusOr<std::vector<AttentionMassMeter>> meters = MassMeters(o, req, T);
  if (!meters.ok()) return meters.status();

  v1::InterveneResponse response;
  for (const CoordinateDef& d : o.basis.coords) {
    const double before = o.values[static_cast<size_t>(d.index)], after = edits.c[static_cast<size_t>(d.index)];
    if (before == after) continue;
    FillCoordinate(d, after, response.add_edited());
    response.add_edited_before(before);
  }
  std::vector<std::string> sets(req.eval_sets().begin(), req.eval_sets().end());
  if (prompts) {
    sets = {"prompts"};
  } else if (sets.empty()) {
    for (const EvalSetInfo& info : o.task->EvalSets()) sets.push_back(info.name);
  }
  PatchPlan plan;
  if (req.has_patch()) {
    absl::StatusOr<PatchPlan> prepared = PreparePatchSweep(
        req.patch(),
        [&](const std::string& hook) {
          return ImirHookGeometry(hook, o.layers, o.heads, o.task->vocab_size() + o.task->num_positions());
        },
        T, {T - 1});
    if (!prepared.ok()) return prepared.status();
    plan = std::move(*prepared);
    if (const std::string& r = req.patch().reference_set(); !r.empty()) {
      if (absl::StatusOr<EvalData> probe = MakeEval(*o.task, r, 1, req.seed()); !probe.ok()) {
        return absl::InvalidArgumentError("patch.reference_set: " + std::string(probe.status().message()));
      }
    }
  }
  for (const PreparedOp& p : edits.activations) {
    if (p.op->reference_set().empty()) continue;
    if (absl::StatusOr<EvalData> probe = MakeEval(*o.task, p.op->reference_set(), 1, req.seed()); !probe.ok()) {
      return absl::InvalidArgumentError(p.field + ".reference_set: " + std::string(probe.status().message()));
    }
  }
  const EvalData* own = prompts ? &prompts->clean : nullptr;
  for (size_t i = 0; i < sets.size(); ++i) {
    absl::StatusOr<EvalData> data =
        prompts ? prompts->scored : MakeEval(*o.task, sets[i], req.n_eval(), req.seed());
    if (!data.ok()) {
      return absl::InvalidArgumentError("eval_sets[" + std::to_string(i) +
                                        "]: " + std::string(data.status().message()));
    }
    if (absl::Status s = CaptureImirReferences(o, *edited, req, *data, i, own, edits.activations); !s.ok()) return s;
    v1::InterventionEffect& e = *response.add_effects();
    e = ImirEffect(o, *edited, req, *data, edits.activations, *meters);
    if (req.has_patch()) {
      if (absl::Status s = ImirPatch(o, req, *data, own, plan, e); !s.ok()) return s;
    }
  }
  return response;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::InterveneRequest, v1::InterveneResponse,
                           [](const AnalysisInput& in, const v1::InterveneRequest& r, const AnalysisProgress&, const CancelToken*) { return ImirIntervene(in.spec, in.checkpoint(), r, in.sources); });

}  // namespace circuitlab::engine
