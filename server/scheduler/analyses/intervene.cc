// Intervene: weight-space and hook-point interventions (SCIENCE.md D.6) on a
// stored checkpoint, clean vs intervened on the same sequences; a job.
#include <algorithm>
#include <cmath>
#include <map>

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr int kMaxInterventions = 64;

bool IsActivationOp(v1::Intervention::Op op) {
  return op >= v1::Intervention::OP_ZERO && op <= v1::Intervention::OP_REPLACE_CONVEX;
}

// Reference activations are kept whole: n_eval x T x width floats (an
// attention pattern: T x heads).
uint64_t ReferenceBytes(const v1::ExperimentSpec& spec, uint64_t n_eval, uint64_t T) {
  const uint64_t heads = static_cast<uint64_t>(engine::SpecFamilyOf(spec).NumHeads(spec));
  return 4ULL * n_eval * T * std::max<uint64_t>(static_cast<uint64_t>(engine::ResidualWidth(spec)), T * heads);
}

// The hook-point fields of an activation op, bounded (the engine checks
// them against the model: hook, head, positions, vector widths).
absl::Status CheckActivationFields(const v1::Intervention& in, const std::string& field) {
  if (in.weights_size() > 16) return absl::InvalidArgumentError(field + ".weights: at most 16 (one per major)");
  for (double w : in.weights()) {
    if (!std::isfinite(w) || w < 0) {
      return absl::InvalidArgumentError(field + ".weights must be finite and non-negative");
    }
  }
  if (in.vectors_size() > 64 || in.positions_size() > 1024) {
    return absl::InvalidArgumentError(field + ": at most 64 vectors and 1024 positions");
  }
  for (const v1::HookVector& v : in.vectors()) {
    if (v.values_size() > 4096) return absl::InvalidArgumentError(field + ".vectors: at most 4096 values each");
  }
  return absl::OkStatus();
}

// One wire op, validated for a run of this model kind (a swap's source
// checkpoint is the caller's to load).
absl::Status CheckOp(const v1::Intervention& in, const std::string& field, bool has_coordinates) {
  if (in.coordinates_size() > 4096) {
    return absl::InvalidArgumentError(field + ".coordinates must have at most 4096 entries");
  }
  if (!std::isfinite(in.scale()) || !std::isfinite(in.value()) || std::abs(in.scale()) > 1e6 ||
      std::abs(in.value()) > 1e6) {
    return absl::InvalidArgumentError(field + ": scale and value must be finite and in [-1e6, 1e6]");
  }
  if (in.op() == v1::Intervention::OP_UNSPECIFIED || !v1::Intervention::Op_IsValid(in.op())) {
    return absl::InvalidArgumentError(field + ".op must be one of the Intervention.Op values (got " +
                                      std::to_string(in.op()) + ")");
  }
  if (!has_coordinates && !IsActivationOp(in.op())) {
    return absl::FailedPreconditionError(field + ": " + v1::Intervention::Op_Name(in.op()) +
                                         " edits IMIR weights; this decoder run takes the hook-point ops "
                                         "OP_ZERO .. OP_REPLACE_CONVEX");
  }
  return IsActivationOp(in.op()) ? CheckActivationFields(in, field) : absl::OkStatus();
}

// A patch sweep's size (the engine checks hooks and positions against the
// model): each site is one forward pass over n_eval sequences per evaluated set.
absl::Status CheckPatch(const v1::PatchSweep& patch, uint64_t T, uint64_t n_eval) {
  constexpr uint64_t kMaxSequences = 4194304;
  if (patch.hooks().empty() || patch.hooks_size() > 16) {
    return absl::InvalidArgumentError("patch.hooks must have 1 to 16 entries, got " +
                                      std::to_string(patch.hooks_size()));
  }
  if (patch.positions_size() > 1024) {
    return absl::InvalidArgumentError("patch.positions must have at most 1024 entries, got " +
                                      std::to_string(patch.positions_size()));
  }
  const uint64_t positions = patch.positions().empty() ? T : static_cast<uint64_t>(patch.positions_size());
  const uint64_t sequences = static_cast<uint64_t>(patch.hooks_size()) * (positions + 1) * n_eval;
  if (sequences > kMaxSequences) {
    return absl::ResourceExhaustedError("patch: " + std::to_string(patch.hooks_size()) + " hooks x " +
                                        std::to_string(positions + 1) + " sites each x n_eval " +
                                        std::to_string(n_eval) + " = " + std::to_string(sequences) +
                                        " sequences per evaluated set, more than " + std::to_string(kMaxSequences) +
                                        "; fewer hooks or positions, or a smaller n_eval");
  }
  return absl::OkStatus();
}

// Intervene's prompts before anything is loaded: the sequences' shapes,
// the pairing a patch sweep needs, one answer (and competing token) per
// prompt or one for all, and the fields that name the service's own
// sequences left empty.
absl::Status CheckPromptShape(const v1::InterveneRequest& r) {
  const v1::Prompts& p = r.prompts();
  if (r.n_eval() != 0) {
    return absl::InvalidArgumentError("n_eval must be 0 with prompts (the prompts are the evaluated sequences), got " +
                                      std::to_string(r.n_eval()));
  }
  if (!r.eval_sets().empty()) {
    return absl::InvalidArgumentError("eval_sets must be empty with prompts: the prompts are the evaluated sequences");
  }
  if (!r.logit_diff_tokens().empty()) {
    return absl::InvalidArgumentError(
        "logit_diff_tokens must be empty with prompts: name the competing tokens in prompts.wrong");
  }
  if (!r.patch().reference_set().empty()) {
    return absl::InvalidArgumentError("patch.reference_set must be empty with prompts: the clean prompts are the "
                                      "run patched from");
  }
  for (int i = 0; i < r.interventions_size(); ++i) {
    if (!r.interventions(i).reference_set().empty()) {
      return absl::InvalidArgumentError("interventions[" + std::to_string(i) +
                                        "].reference_set must be empty with prompts: the clean prompts are the "
                                        "reference");
    }
  }
  CL_RETURN_IF_ERROR(CheckSequenceShape(p.clean(), "prompts.clean"));
  if (r.has_patch() != (p.corrupted_size() > 0)) {
    return absl::InvalidArgumentError(r.has_patch() ? "prompts.corrupted: a patch sweep patches the clean prompts "
                                                      "into corrupted ones; give one per clean prompt"
                                                    : "prompts.corrupted is read by a patch sweep only; add patch "
                                                      "or leave it empty");
  }
  if (r.has_patch()) {
    CL_RETURN_IF_ERROR(CheckSequenceShape(p.corrupted(), "prompts.corrupted"));
    if (p.corrupted_size() != p.clean_size() || p.corrupted(0).tokens_size() != p.clean(0).tokens_size()) {
      return absl::InvalidArgumentError(
          "prompts.corrupted must pair one to one with prompts.clean (" + std::to_string(p.clean_size()) +
          " sequences of " + std::to_string(p.clean(0).tokens_size()) + " tokens), got " +
          std::to_string(p.corrupted_size()) + " of " + std::to_string(p.corrupted(0).tokens_size()));
    }
  }
  if (p.answers_size() != 1 && p.answers_size() != p.clean_size()) {
    return absl::InvalidArgumentError("prompts.answers must hold one token id per clean prompt (" +
                                      std::to_string(p.clean_size()) + ") or one for all, got " +
                                      std::to_string(p.answers_size()));
  }
  if (p.wrong_size() > 1 && p.wrong_size() != p.clean_size()) {
    return absl::InvalidArgumentError("prompts.wrong must be empty, one token id for all or one per clean prompt (" +
                                      std::to_string(p.clean_size()) + "), got " + std::to_string(p.wrong_size()));
  }
  return absl::OkStatus();
}

// The prompts against the run's model: token and position ids, the
// answers' and competing tokens' ids in the vocabulary.
absl::Status CheckPromptsFit(const v1::ExperimentSpec& spec, const v1::Prompts& p) {
  CL_RETURN_IF_ERROR(CheckSequencesFit(spec, p.clean(), "prompts.clean", "Intervene with prompts"));
  if (p.corrupted_size() > 0) {
    CL_RETURN_IF_ERROR(CheckSequencesFit(spec, p.corrupted(), "prompts.corrupted", "Intervene with prompts"));
  }
  const uint64_t vocab = static_cast<uint64_t>(engine::ShapeOf(spec).vocab);
  for (const auto& [ids, name] : {std::pair{&p.answers(), "prompts.answers"}, std::pair{&p.wrong(), "prompts.wrong"}}) {
    for (int i = 0; i < ids->size(); ++i) {
      if ((*ids)[i] >= vocab) {
        return absl::InvalidArgumentError(std::string(name) + "[" + std::to_string(i) + "] must be in [0, " +
                                          std::to_string(vocab - 1) + "] (this model's vocabulary), got " +
                                          std::to_string((*ids)[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The request's lists bounded before anything is loaded or copied.
absl::Status CheckCounts(const v1::InterveneRequest& request) {
  if (request.interventions_size() > kMaxInterventions) {
    return absl::InvalidArgumentError("interventions must have at most " + std::to_string(kMaxInterventions) +
                                      " entries, got " + std::to_string(request.interventions_size()));
  }
  if (request.interventions().empty() && !request.has_patch()) {
    return absl::InvalidArgumentError("interventions must have 1 to " + std::to_string(kMaxInterventions) +
                                      " entries (or give a patch sweep), got 0");
  }
  if (request.eval_sets_size() > 16) {
    return absl::InvalidArgumentError("eval_sets must have at most 16 entries, got " +
                                      std::to_string(request.eval_sets_size()));
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
  }
  if (request.logit_diff_tokens_size() > 2) {  // bounded before copying; the engine checks the pair
    return absl::InvalidArgumentError("logit_diff_tokens must be empty or two token ids (t1, t2), got " +
                                      std::to_string(request.logit_diff_tokens_size()));
  }
  return absl::OkStatus();
}

// Every evaluation set the request names is one of the run's.
absl::Status CheckSetNames(AnalysisCore& core, const v1::ExperimentSpec& spec, const v1::InterveneRequest& request) {
  for (int i = 0; i < request.eval_sets_size(); ++i) {
    CL_RETURN_IF_ERROR(CheckEvalSet(core.analyzer(), spec, request.eval_sets(i), "eval_sets[" + std::to_string(i) + "]"));
  }
  if (!request.patch().reference_set().empty()) {
    CL_RETURN_IF_ERROR(CheckEvalSet(core.analyzer(), spec, request.patch().reference_set(), "patch.reference_set"));
  }
  for (int i = 0; i < request.interventions_size(); ++i) {
    if (const std::string& r = request.interventions(i).reference_set(); !r.empty()) {
      CL_RETURN_IF_ERROR(
          CheckEvalSet(core.analyzer(), spec, r, "interventions[" + std::to_string(i) + "].reference_set"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AnalysisPlan<v1::InterveneResponse>> PlanIntervene(AnalysisCore& core, const v1::InterveneRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_RETURN_IF_ERROR(CheckCounts(request));
  const bool prompts = request.has_prompts();
  if (prompts) {
    CL_RETURN_IF_ERROR(CheckPromptShape(request));
  } else {
    CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), 16, "n_eval"));
  }
  CL_ASSIGN_OR_RETURN(auto found, core.RunCheckpoint(id, request.step(), request.run_id()));
  const v1::ExperimentSpec& spec = found.first;
  const bool has_coordinates = engine::SpecFamilyOf(spec).has_coordinates();
  if (prompts) CL_RETURN_IF_ERROR(CheckPromptsFit(spec, request.prompts()));
  CL_RETURN_IF_ERROR(CheckSetNames(core, spec, request));
  v1::InterveneRequest canonical = request;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  if (!prompts) canonical.set_n_eval(request.n_eval() == 0 ? 2048 : request.n_eval());
  // The sequences each evaluated set holds and their length.
  const uint64_t n = prompts ? static_cast<uint64_t>(request.prompts().clean_size()) : canonical.n_eval();
  const uint64_t T = prompts ? static_cast<uint64_t>(request.prompts().clean(0).tokens_size())
                             : static_cast<uint64_t>(engine::ShapeOf(spec).seq_len);
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  canonical.set_force(false);
  uint64_t reference_bytes = 0;  // kept whole while the job runs
  std::map<int, engine::StoredCheckpoint> swap_sources;  // by intervention index
  for (int i = 0; i < request.interventions_size(); ++i) {
    v1::Intervention* in = canonical.mutable_interventions(i);
    const std::string field = "interventions[" + std::to_string(i) + "]";
    CL_RETURN_IF_ERROR(CheckOp(*in, field, has_coordinates));
    if (IsActivationOp(in->op())) {
      const uint64_t need = ReferenceBytes(spec, n, T);
      if (need > core.limits().max_run_memory_bytes) {
        return absl::ResourceExhaustedError(field + ": the reference activations need about " +
                                            std::to_string(need >> 20) + " MiB, more than --max-run-memory-mb; "
                                            "lower n_eval");
      }
      reference_bytes += need;
    }
    if (in->op() == v1::Intervention::OP_SWAP_COORDINATES) {
      CL_ASSIGN_OR_RETURN(int64_t source, ParseRunId(in->source_run_id(), field + ".source_run_id"));
      CL_ASSIGN_OR_RETURN(auto src, core.RunCheckpoint(source, in->source_step(), in->source_run_id()));
      CL_RETURN_IF_ERROR(NeedsCoordinates(src.first, "Intervene (swap)"));
      in->set_source_run_id(FormatRunId(source));
      in->set_source_step(static_cast<uint64_t>(src.second.step));
      swap_sources[i] = {std::move(src.first), std::move(src.second.bytes)};
    }
  }
  if (request.has_patch()) {
    CL_RETURN_IF_ERROR(CheckPatch(request.patch(), T, n));
    reference_bytes += ReferenceBytes(spec, n, T);  // one hook's source activations at a time
  }
  // The clean and intervened logits of one evaluation set (float32, n_eval x
  // T x vocab at most) come on top of the reference activations.
  const uint64_t memory =
      JobMemory(spec, reference_bytes + 8ULL * n * T *
                                             static_cast<uint64_t>(engine::ShapeOf(spec).vocab));
  engine::AnalysisInput input{spec, {{found.second.step, std::move(found.second.bytes)}}, std::move(swap_sources)};
  auto plan = EnginePlan<v1::InterveneResponse>(core.analyzer(), id, canonical, std::move(input), memory,
                                                [canonical](v1::InterveneResponse& done) {
                                                  done.set_run_id(canonical.run_id());
                                                  done.set_step(canonical.step());
                                                });
  plan.version = kLayersFromOne;
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("intervene", v1::InterveneRequest, v1::InterveneResponse, PlanIntervene);

}  // namespace circuitlab::scheduler
