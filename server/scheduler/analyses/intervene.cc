// Intervene: weight-space and hook-point interventions (SCIENCE.md D.6) on a
// stored checkpoint, clean vs intervened on the same sequences; a job.
#include "server/scheduler/analysis_core.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr int kMaxInterventions = 64;

bool IsActivationOp(v1::Intervention::Op op) {
  return op >= v1::Intervention::OP_ZERO && op <= v1::Intervention::OP_REPLACE_CONVEX;
}

// Reference activations are kept whole: n_eval x T x width floats (an
// attention pattern: T x heads).
uint64_t ReferenceBytes(const v1::ExperimentSpec& spec, uint64_t n_eval) {
  const bool decoder = spec.model().kind_case() == v1::ModelSpec::kDecoder;
  const uint64_t T = engine::ShapeOf(spec).seq_len;
  const uint64_t heads = decoder ? spec.model().decoder().num_heads() : spec.model().imir().num_heads();
  return 4ULL * n_eval * T * std::max<uint64_t>(static_cast<uint64_t>(engine::ResidualWidth(spec)), T * heads);
}

std::optional<engine::InterventionOp::Kind> KindOf(v1::Intervention::Op op) {
  using Kind = engine::InterventionOp::Kind;
  switch (op) {
    case v1::Intervention::OP_ZERO: return Kind::kActZero;
    case v1::Intervention::OP_MEAN: return Kind::kActMean;
    case v1::Intervention::OP_RESAMPLE: return Kind::kActResample;
    case v1::Intervention::OP_PROJECT_OUT: return Kind::kActProjectOut;
    case v1::Intervention::OP_PROJECT_ONTO: return Kind::kActProjectOnto;
    case v1::Intervention::OP_ADD: return Kind::kActAdd;
    case v1::Intervention::OP_PATCH: return Kind::kActPatch;
    case v1::Intervention::OP_REPLACE_CONVEX: return Kind::kActReplaceConvex;
    case v1::Intervention::OP_ZERO_COORDINATE: return Kind::kZero;
    case v1::Intervention::OP_SCALE_COORDINATE: return Kind::kScale;
    case v1::Intervention::OP_SET_COORDINATE: return Kind::kSet;
    case v1::Intervention::OP_ABLATE_HEAD: return Kind::kAblateHead;
    case v1::Intervention::OP_KEEP_ONLY: return Kind::kKeepOnly;
    case v1::Intervention::OP_SWAP_COORDINATES: return Kind::kSwap;
    default: return std::nullopt;
  }
}

// The hook-point fields of an activation op, bounded.
absl::Status CopyActivationFields(const v1::Intervention& in, const std::string& field, engine::InterventionOp* op) {
  op->hook = in.hook();
  op->head = static_cast<int>(in.head());
  op->positions.assign(in.positions().begin(), in.positions().end());
  op->reference_set = in.reference_set();
  op->centre = in.centre();
  if (in.weights_size() > 16) return absl::InvalidArgumentError(field + ".weights: at most 16 (one per major)");
  for (double w : in.weights()) {
    if (!std::isfinite(w) || w < 0) {
      return absl::InvalidArgumentError(field + ".weights must be finite and non-negative");
    }
  }
  op->weights.assign(in.weights().begin(), in.weights().end());
  op->subtract = in.subtract();
  if (in.vectors_size() > 64 || in.positions_size() > 1024) {
    return absl::InvalidArgumentError(field + ": at most 64 vectors and 1024 positions");
  }
  for (const v1::HookVector& v : in.vectors()) {
    if (v.values_size() > 4096) return absl::InvalidArgumentError(field + ".vectors: at most 4096 values each");
    op->vectors.emplace_back(v.values().begin(), v.values().end());
  }
  return absl::OkStatus();
}

// One wire op as the engine's, validated (a swap's source checkpoint is the
// caller's to load).
absl::StatusOr<engine::InterventionOp> ToEngineOp(const v1::Intervention& in, const std::string& field, bool decoder) {
  if (in.coordinates_size() > 4096) {
    return absl::InvalidArgumentError(field + ".coordinates must have at most 4096 entries");
  }
  engine::InterventionOp op;
  op.coordinates.assign(in.coordinates().begin(), in.coordinates().end());
  op.scale = in.scale();
  op.value = in.value();
  op.layer = static_cast<int>(in.layer());
  op.head = in.head() == 0 ? 1 : static_cast<int>(in.head());
  if (!std::isfinite(op.scale) || !std::isfinite(op.value) || std::abs(op.scale) > 1e6 || std::abs(op.value) > 1e6) {
    return absl::InvalidArgumentError(field + ": scale and value must be finite and in [-1e6, 1e6]");
  }
  const std::optional<engine::InterventionOp::Kind> kind = KindOf(in.op());
  if (!kind) {
    return absl::InvalidArgumentError(field + ".op must be one of the Intervention.Op values (got " +
                                      std::to_string(in.op()) + ")");
  }
  op.kind = *kind;
  if (decoder && !IsActivationOp(in.op())) {
    return absl::FailedPreconditionError(field + ": " + v1::Intervention::Op_Name(in.op()) +
                                         " edits IMIR weights; this decoder run takes the hook-point ops "
                                         "OP_ZERO .. OP_REPLACE_CONVEX");
  }
  if (IsActivationOp(in.op())) CL_RETURN_IF_ERROR(CopyActivationFields(in, field, &op));
  return op;
}

// The DONE answer of an intervention.
v1::InterveneResponse InterveneDone(const v1::InterveneRequest& canonical, const engine::InterveneReport& r) {
  v1::InterveneResponse resp;
  resp.set_state(v1::ANALYSIS_STATE_DONE);
  resp.set_progress(1.0);
  resp.set_run_id(canonical.run_id());
  resp.set_step(canonical.step());
  for (const engine::EffectReport& e : r.effects) {
    v1::InterventionEffect* o = resp.add_effects();
    o->set_eval_set(e.eval_set);
    o->set_loss_clean(e.loss_clean);
    o->set_loss(e.loss);
    o->set_accuracy_clean(e.accuracy_clean);
    o->set_accuracy(e.accuracy);
    o->set_kl_clean(e.kl_clean);
    o->set_has_logit_diff(e.has_logit_diff);
    o->set_logit_diff_clean(e.logit_diff_clean);
    o->set_logit_diff(e.logit_diff);
    o->set_alt_name(e.alt_name);
    o->set_has_kl_ref(e.has_kl_ref);
    o->set_ref_name(e.ref_name);
    o->set_kl_ref_clean(e.kl_ref_clean);
    o->set_kl_ref(e.kl_ref);
    for (const engine::EffectReport::Mass& m : e.attention_mass) {
      v1::AttentionMassEffect* a = o->add_attention_mass();
      a->set_pattern(m.pattern);
      a->mutable_clean()->Add(m.clean.begin(), m.clean.end());
      a->mutable_intervened()->Add(m.intervened.begin(), m.intervened.end());
    }
  }
  for (const engine::InterveneReport::Edited& e : r.edited) {
    FillCoordinate(ToCoordinateRow(e.def), e.after, resp.add_edited());
    resp.add_edited_before(e.before);
  }
  return resp;
}

}  // namespace

absl::StatusOr<v1::InterveneResponse> AnalysisCore::Intervene(
    const v1::InterveneRequest& request, const std::string& client) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), 16, "n_eval"));
  if (request.interventions_size() == 0 || request.interventions_size() > kMaxInterventions) {
    return absl::InvalidArgumentError("interventions must have 1 to " + std::to_string(kMaxInterventions) +
                                      " entries, got " + std::to_string(request.interventions_size()));
  }
  if (request.eval_sets_size() > 16) {
    return absl::InvalidArgumentError("eval_sets must have at most 16 entries, got " +
                                      std::to_string(request.eval_sets_size()));
  }
  CL_ASSIGN_OR_RETURN(auto found, RunCheckpoint(id, request.step(), request.run_id()));
  const v1::ExperimentSpec& spec = found.first;
  const bool decoder = spec.model().kind_case() == v1::ModelSpec::kDecoder;
  v1::InterveneRequest canonical = request;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_n_eval(request.n_eval() == 0 ? 2048 : request.n_eval());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  canonical.set_force(false);
  uint64_t reference_bytes = 0;  // kept whole while the job runs
  engine::InterveneRequest ir;
  ir.eval_sets.assign(request.eval_sets().begin(), request.eval_sets().end());
  ir.n_eval = canonical.n_eval();
  ir.seed = canonical.seed();
  ir.selection = ToSelection(canonical.selection());
  for (int i = 0; i < request.interventions_size(); ++i) {
    v1::Intervention* in = canonical.mutable_interventions(i);
    const std::string field = "interventions[" + std::to_string(i) + "]";
    CL_ASSIGN_OR_RETURN(engine::InterventionOp op, ToEngineOp(*in, field, decoder));
    if (IsActivationOp(in->op())) {
      const uint64_t need = ReferenceBytes(spec, canonical.n_eval());
      if (need > limits_.max_run_memory_bytes) {
        return absl::ResourceExhaustedError(field + ": the reference activations need about " +
                                            std::to_string(need >> 20) + " MiB, more than --max-run-memory-mb; "
                                            "lower n_eval");
      }
      reference_bytes += need;
    }
    if (op.kind == engine::InterventionOp::Kind::kSwap) {
      CL_ASSIGN_OR_RETURN(int64_t source, ParseRunId(in->source_run_id(), field + ".source_run_id"));
      CL_ASSIGN_OR_RETURN(auto src, RunCheckpoint(source, in->source_step(), in->source_run_id()));
      CL_RETURN_IF_ERROR(NeedsImir(src.first, "Intervene (swap)"));
      in->set_source_run_id(FormatRunId(source));
      in->set_source_step(static_cast<uint64_t>(src.second.step));
      op.source_spec = std::move(src.first);
      op.source_checkpoint = std::move(src.second.bytes);
    }
    ir.ops.push_back(std::move(op));
  }
  if (request.attention_mass_size() > 16) {
    return absl::InvalidArgumentError("attention_mass must have at most 16 entries, got " +
                                      std::to_string(request.attention_mass_size()));
  }
  for (const v1::AttentionMass& a : request.attention_mass()) {
    // Keys and queries beyond T are refused by the engine, naming the field.
    if (a.keys_size() > 4096 || a.queries_size() > 4096) {
      return absl::InvalidArgumentError("attention_mass: at most 4096 keys and queries each");
    }
    ir.attention_mass.push_back({a.pattern(), {a.keys().begin(), a.keys().end()},
                                 {a.queries().begin(), a.queries().end()}});
  }
  if (request.logit_diff_tokens_size() > 2) {  // bounded before copying; the engine checks the pair
    return absl::InvalidArgumentError("logit_diff_tokens must be empty or two token ids (t1, t2), got " +
                                      std::to_string(request.logit_diff_tokens_size()));
  }
  ir.logit_diff_tokens.assign(request.logit_diff_tokens().begin(), request.logit_diff_tokens().end());
  // The clean and intervened logits of one evaluation set (float32, n_eval x
  // T x vocab at most) come on top of the reference activations.
  const uint64_t memory =
      JobMemory(spec, reference_bytes + 8ULL * canonical.n_eval() * engine::ShapeOf(spec).seq_len *
                                             static_cast<uint64_t>(engine::ShapeOf(spec).vocab));
  AnalysisWork work = [this, spec, bytes = std::move(found.second.bytes), ir = std::move(ir), canonical](
                          const std::function<void(double)>&, const CancelToken*) -> absl::StatusOr<std::string> {
    CL_ASSIGN_OR_RETURN(engine::InterveneReport r, analyzer_->Intervene(spec, bytes, ir));
    return InterveneDone(canonical, r).SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(AnalysisAnswer a, Enqueue("intervene", id, canonical.SerializeAsString(), request.force(),
                                                 client, memory, std::move(work)));
  return ResponseFromAnswer<v1::InterveneResponse>(a);
}

}  // namespace circuitlab::scheduler
