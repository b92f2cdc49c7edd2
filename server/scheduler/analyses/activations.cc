// GetActivations: the tensors at named hook points on the caller's own
// sequences at a stored checkpoint; the request's shape checked here (on
// the calling thread, before anything is loaded), the canonical request,
// the job; then token and position ranges, hook names and the answer's
// size against the run's model (torch-free, from its spec), so that a bad
// request is INVALID_ARGUMENT before any job. The engine
// (engine/analysis/activations.cc) checks again.
#include <cctype>
#include <set>
#include <string>
#include <utility>

#include "server/common/status_macros.h"
#include "server/engine/families/spec/spec_family.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr int kMaxHooks = 32;
constexpr size_t kMaxHookName = 64;

absl::Status CheckShape(const v1::GetActivationsRequest& r) {
  CL_RETURN_IF_ERROR(CheckSequenceShape(r.sequences(), "sequences"));
  if (r.hooks_size() > kMaxHooks) {
    return absl::InvalidArgumentError("hooks must have at most " + std::to_string(kMaxHooks) + " entries, got " +
                                      std::to_string(r.hooks_size()));
  }
  for (int i = 0; i < r.hooks_size(); ++i) {
    if (r.hooks(i).empty() || r.hooks(i).size() > kMaxHookName) {
      return absl::InvalidArgumentError("hooks[" + std::to_string(i) + "] must be a hook point name of 1 to " +
                                        std::to_string(kMaxHookName) + " bytes");
    }
  }
  return absl::OkStatus();
}

constexpr int64_t kMaxValues = int64_t{1} << 22;     // the answer: 16 MiB of floats
constexpr int64_t kMaxAttention = int64_t{1} << 26;  // the forward's attention probabilities

// A hook point's width on the run's model (the values per sequence and
// position; per query for attention: heads x T), or InvalidArgument naming
// the points the model has. The names are the engine's (imir_model.h,
// decoder_model.h), which checks them again when the job runs.
absl::StatusOr<int64_t> HookWidth(const v1::ExperimentSpec& spec, const std::string& hook, int64_t T, int i) {
  const engine::TaskShape shape = engine::ShapeOf(spec);
  const bool imir = engine::SpecFamilyOf(spec).has_coordinates();  // the IMIR block model
  const int64_t L = imir ? spec.model().imir().num_layers() : spec.model().decoder().num_layers();
  const int64_t H = imir ? spec.model().imir().num_heads() : spec.model().decoder().num_heads();
  if (hook == "logits") return shape.vocab;
  const int64_t D = imir ? shape.vocab + shape.positions : spec.model().decoder().d_model();
  if (hook == "embed") return D;
  if (!imir && hook == "final_ln" && spec.model().decoder().final_layernorm()) return D;
  const std::string allowed =
      imir ? "embed, L{l}.attn, L{l}.H{h}.out, L{l}.resid (l in [1, " + std::to_string(L) + "], h in [1, " +
                 std::to_string(H) + "]) or logits"
           : "embed, L{l}.resid_pre, L{l}.attn.pattern, L{l}.attn.head, L{l}.post_attn, L{l}.post_mlp (l in [1, " +
                 std::to_string(L) + "])" + (spec.model().decoder().final_layernorm() ? ", final_ln" : "") +
                 " or logits";
  const auto bad = [&] {
    return absl::InvalidArgumentError("hooks[" + std::to_string(i) + "] '" + hook + "' is not a hook point of this " +
                                      (imir ? "IMIR" : "decoder") + " model: " + allowed);
  };
  const size_t dot = hook.find('.');
  if (hook.size() < 3 || hook[0] != 'L' || dot == std::string::npos || dot < 2 || dot > 5) return bad();
  int64_t l = 0;
  for (size_t k = 1; k < dot; ++k) {
    if (!std::isdigit(static_cast<unsigned char>(hook[k]))) return bad();
    l = l * 10 + (hook[k] - '0');
  }
  const std::string rest = hook.substr(dot + 1);
  if (imir) {
    if (l < 1 || l > L) return bad();
    int64_t below = D;  // d_{l-1}
    for (int64_t k = 1; k < l; ++k) below *= H + 1;
    if (rest == "attn") return H * T;
    if (rest == "resid") return below * (H + 1);
    const size_t out = rest.find(".out");
    if (rest.size() < 6 || rest[0] != 'H' || out == std::string::npos || out + 4 != rest.size() || out > 4) {
      return bad();
    }
    int64_t h = 0;
    for (size_t k = 1; k < out; ++k) {
      if (!std::isdigit(static_cast<unsigned char>(rest[k]))) return bad();
      h = h * 10 + (rest[k] - '0');
    }
    if (h < 1 || h > H) return bad();
    return below;
  }
  if (l < 1 || l > L) return bad();
  if (rest == "attn.pattern") return H * T;
  if (rest == "resid_pre" || rest == "attn.head" || rest == "post_attn" || rest == "post_mlp") return D;
  return bad();
}

// Token and position ids in range, the context length, the hooks and the
// answer's size, against the run's model.
absl::Status CheckAgainstModel(const v1::ExperimentSpec& spec, const v1::GetActivationsRequest& r) {
  CL_RETURN_IF_ERROR(CheckSequencesFit(spec, r.sequences(), "sequences", "GetActivations"));
  const bool imir = engine::SpecFamilyOf(spec).has_coordinates();  // the IMIR block model
  const int64_t B = r.sequences_size(), T = r.sequences(0).tokens_size();
  int64_t values = 0;
  for (int i = 0; i < r.hooks_size(); ++i) {
    CL_ASSIGN_OR_RETURN(int64_t width, HookWidth(spec, r.hooks(i), T, i));
    values += B * T * width;
  }
  if (values > kMaxValues) {
    return absl::InvalidArgumentError("these hooks hold " + std::to_string(values) +
                                      " values on these sequences, more than " + std::to_string(kMaxValues) +
                                      "; ask fewer hooks or sequences, or shorter ones");
  }
  const int64_t L = imir ? spec.model().imir().num_layers() : spec.model().decoder().num_layers();
  const int64_t H = imir ? spec.model().imir().num_heads() : spec.model().decoder().num_heads();
  if (B * T * T * H * L > kMaxAttention) {
    return absl::InvalidArgumentError("the forward pass would hold " + std::to_string(B * T * T * H * L) +
                                      " attention weights (sequences x T^2 x heads x layers), more than " +
                                      std::to_string(kMaxAttention) + "; send fewer or shorter sequences");
  }
  return absl::OkStatus();
}

absl::StatusOr<AnalysisPlan<v1::GetActivationsResponse>> PlanActivations(AnalysisCore& core,
                                                                        const v1::GetActivationsRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckShape(request));
  CL_ASSIGN_OR_RETURN(auto found, core.RunCheckpoint(id, request.step(), request.run_id()));
  const v1::ExperimentSpec& spec = found.first;
  // The canonical request: the step resolved, each hook once (first
  // mention), "logits" when none, force dropped.
  v1::GetActivationsRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  *canonical.mutable_sequences() = request.sequences();
  std::set<std::string> seen;
  for (const std::string& h : request.hooks()) {
    if (seen.insert(h).second) canonical.add_hooks(h);
  }
  if (canonical.hooks_size() == 0) canonical.add_hooks("logits");
  CL_RETURN_IF_ERROR(CheckAgainstModel(spec, canonical));
  engine::AnalysisInput input{spec, {{found.second.step, std::move(found.second.bytes)}}, {}};
  // The answer (at most 16 MiB of floats) and its forward pass's attention
  // (at most 256 MiB, the engine's bound) beside the model.
  auto plan = EnginePlan<v1::GetActivationsResponse>(core.analyzer(), id, canonical, std::move(input),
                                                     JobMemory(spec, uint64_t{64} << 20),
                                                     [canonical](v1::GetActivationsResponse& done) {
                                                       done.set_run_id(canonical.run_id());
                                                       done.set_step(canonical.step());
                                                     });
  plan.version = kLayersFromOne;
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("activations", v1::GetActivationsRequest, v1::GetActivationsResponse, PlanActivations);

}  // namespace circuitlab::scheduler
