// AnalysisCore::AnalyzeTaskVectors: validation and defaults of a
// task-vector request, its targets (a run's checkpoint, all of them, or a
// sweep's runs), and the queued job that runs the engine on each.
#include <algorithm>
#include <set>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/catalog.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

const std::vector<std::string> kAnalyses = {"p0", "p1", "p2", "p3", "steering", "ood_r2", "kl", "dissociation",
                                            "dyck_p0"};
const std::set<std::string> kHooks = {"post_mlp", "post_attn", "resid_pre"};
constexpr int kMaxCheckpoints = 200;
constexpr int kMaxPositions = 64;

absl::Status Range(const std::string& field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(field + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                      "] (0 = default), got " + std::to_string(value));
  }
  return absl::OkStatus();
}

// Fills `value` with `def` when 0, then checks [lo, hi].
template <typename Msg, typename Get, typename Set>
absl::Status Default(Msg* m, Get get, Set set, uint32_t def, const std::string& field, uint32_t lo, uint32_t hi) {
  if ((m->*get)() == 0) (m->*set)(def);
  return Range(field, (m->*get)(), lo, hi);
}

absl::Status HookKind(const std::string& field, std::string* hook, const std::string& def) {
  if (hook->empty()) *hook = def;
  if (kHooks.count(*hook) == 0) {
    return absl::InvalidArgumentError(field + " must be post_mlp, post_attn or resid_pre, got " + Quote(*hook));
  }
  return absl::OkStatus();
}

struct Target {
  int64_t id = 0;
  v1::ExperimentSpec spec;
  std::vector<int64_t> steps;
  std::string sweep_values;
};

absl::Status NeedsLatent(const v1::ExperimentSpec& spec, int64_t id) {
  if (engine::SpecFamilyOf(spec).has_task_vectors()) return absl::OkStatus();
  return absl::FailedPreconditionError("AnalyzeTaskVectors needs a run of task.latent on model.decoder; " +
                                       FormatRunId(id) + " trains task." + engine::TaskName(spec.task()) +
                                       " on model.imir (ask DetectCircuit, ProjectCheckpoint, LabelRun)");
}

// Largest tensor the request keeps at once for one target, in bytes
// (float64 hidden states), so that it stays inside the per-run memory limit.
// Whether the request asks for analysis `a` ("p0", "dissociation", ...).
bool Asks(const v1::AnalyzeTaskVectorsRequest& c, std::string_view a) {
  return std::find(c.analyses().begin(), c.analyses().end(), a) != c.analyses().end();
}

uint64_t EstimateBytes(const v1::ExperimentSpec& spec, const v1::AnalyzeTaskVectorsRequest& c) {
  const auto& m = spec.model().decoder();
  const engine::TaskShape shape = engine::ShapeOf(spec);
  const double D = m.d_model(), V = static_cast<double>(shape.vocab), T = static_cast<double>(shape.seq_len);
  const double K = spec.task().latent().num_majors();
  const double layers = c.layers_size() > 0 ? c.layers_size() : m.num_layers();
  double cells = 0;
  if (Asks(c, "p2")) {
    cells = T - 1;
  } else if (Asks(c, "p0") || Asks(c, "p1")) {
    cells = c.positions_size() > 0 ? c.positions_size() : 6;
  }
  double most = 8.0 * D * layers * V * K * c.samples_per_cell() * cells;
  if (Asks(c, "p3")) most = std::max(most, 8.0 * D * layers * K * c.p3_samples() * T * 2.0);
  if (Asks(c, "steering")) {
    most = std::max(most, 8.0 * D * K * c.steering_est_samples() * T + 24.0 * c.steering_samples() * T * V);
  }
  if (Asks(c, "ood_r2")) most = std::max(most, 8.0 * D * layers * (K + c.ood_tasks()) * c.ood_samples() * T);
  if (Asks(c, "dyck_p0")) {
    const double tasks = K + std::min<uint32_t>(32, 1u << std::max(0, spec.task().latent().diversity()));
    most = std::max(most, 8.0 * D * layers * tasks * c.samples_per_cell() * T);
  }
  if (Asks(c, "dissociation")) {
    // Probe states, design and their pseudo-inverse; the statistics probe.
    const double rows = std::max(c.probe_samples(), c.stats_samples()) * T;
    most = std::max(most, 8.0 * rows * (3.0 * D + 2.0 * (K + V + 1)));
  }
  return static_cast<uint64_t>(most);
}

// The newest checkpoint of every run of a sweep.
absl::StatusOr<std::vector<Target>> SweepTargets(store::Store* store, const std::string& sweep_id) {
  std::vector<Target> targets;
  CL_ASSIGN_OR_RETURN(int64_t sid, ParseSweepId(sweep_id));
  CL_RETURN_IF_ERROR(store->GetSweep(sid).status());
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store->SweepRuns(sid));
  for (const store::RunRow& row : runs) {
    Target t;
    t.id = row.id;
    if (!t.spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + FormatRunId(row.id));
    CL_RETURN_IF_ERROR(NeedsLatent(t.spec, row.id));
    CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, store->CheckpointSteps(row.id));
    if (steps.empty()) {
      return absl::FailedPreconditionError(FormatRunId(row.id) + " of " + sweep_id +
                                           " has no checkpoint yet; ask again when the sweep's runs have trained");
    }
    t.steps = {steps.back()};
    t.sweep_values = row.sweep_values;
    targets.push_back(std::move(t));
  }
  if (targets.empty()) return absl::FailedPreconditionError("sweep " + sweep_id + " has no runs");
  return targets;
}

// One run's checkpoint: the newest, `step`, or all of them.
absl::StatusOr<Target> RunTarget(store::Store* store, const v1::AnalyzeTaskVectorsRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store->GetRun(id));
  Target t;
  t.id = id;
  if (!t.spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + request.run_id());
  CL_RETURN_IF_ERROR(NeedsLatent(t.spec, id));
  CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, store->CheckpointSteps(id));
  if (steps.empty()) return absl::FailedPreconditionError("run " + request.run_id() + " has no checkpoint yet");
  if (request.all_checkpoints()) {
    if (static_cast<int>(steps.size()) > kMaxCheckpoints) {
      return absl::ResourceExhaustedError("run " + request.run_id() + " has " + std::to_string(steps.size()) +
                                          " checkpoints; all_checkpoints analyses at most " +
                                          std::to_string(kMaxCheckpoints));
    }
    t.steps = steps;
  } else if (request.step() != 0) {
    if (std::find(steps.begin(), steps.end(), static_cast<int64_t>(request.step())) == steps.end()) {
      const std::string have = absl::StrJoin(steps, ", ");
      return absl::NotFoundError("run " + request.run_id() + " has no checkpoint at step " +
                                 std::to_string(request.step()) + " (checkpoints: " + have + ")");
    }
    t.steps = {static_cast<int64_t>(request.step())};
  } else {
    t.steps = {steps.back()};
  }
  return t;
}

// The analyses asked for (or the kind's default), each valid for every target.
absl::Status CanonicalAnalyses(const v1::AnalyzeTaskVectorsRequest& request, const std::vector<Target>& targets,
                               v1::AnalyzeTaskVectorsRequest* canonical) {
  v1::AnalyzeTaskVectorsRequest& c = *canonical;
  std::set<std::string> chosen;
  for (int i = 0; i < request.analyses_size(); ++i) {
    const std::string& a = request.analyses(i);
    if (std::find(kAnalyses.begin(), kAnalyses.end(), a) == kAnalyses.end()) {
      return absl::InvalidArgumentError("analyses[" + std::to_string(i) +
                                        "] must be one of p0, p1, p2, p3, "
                                        "steering, ood_r2, kl, dissociation, dyck_p0, got " +
                                        Quote(a));
    }
    chosen.insert(a);
  }
  c.clear_analyses();
  // "All" is what the first target's family offers for its task.
  const v1::ExperimentSpec& first = targets[0].spec;
  for (const std::string& a : kAnalyses) {
    const bool offered = engine::SpecFamilyOf(first).OffersTaskVectorAnalysis(a, first.task().latent());
    if (chosen.empty() ? offered : chosen.count(a) > 0) c.add_analyses(a);
  }
  for (const Target& t : targets) {
    const v1::LatentKind k = t.spec.task().latent().kind();
    for (const std::string& a : c.analyses()) {
      if (!engine::SpecFamilyOf(t.spec).OffersTaskVectorAnalysis(a, t.spec.task().latent())) {
        return absl::FailedPreconditionError(
            "analysis " + a + " does not apply to " + FormatRunId(t.id) + " (" + v1::LatentKind_Name(k) +
            "): DICE and MARKOV runs have p0, p1, p2, p3, steering, ood_r2, kl, dissociation; REGRESSION runs p0, "
            "p2, p3, steering, ood_r2, kl; DYCK runs ood_r2 and dyck_p0");
      }
    }
  }
  return absl::OkStatus();
}

// Hooks, sample counts and options: defaults filled in, ranges checked.
absl::Status FillDefaults(const v1::AnalyzeTaskVectorsRequest& request, v1::AnalyzeTaskVectorsRequest* canonical) {
  v1::AnalyzeTaskVectorsRequest& c = *canonical;
  CL_RETURN_IF_ERROR(HookKind("hook", c.mutable_hook(), "post_mlp"));
  if (c.paper_compat()) {
    if (!request.estimation_hook().empty() || !request.injection_hook().empty()) {
      return absl::InvalidArgumentError("paper_compat sets estimation_hook post_mlp and injection_hook post_attn; "
                                        "give paper_compat or the hooks, not both");
    }
    c.set_estimation_hook("post_mlp");
    c.set_injection_hook("post_attn");
  }
  CL_RETURN_IF_ERROR(HookKind("estimation_hook", c.mutable_estimation_hook(), "post_attn"));
  CL_RETURN_IF_ERROR(HookKind("injection_hook", c.mutable_injection_hook(), "post_attn"));
  using R = v1::AnalyzeTaskVectorsRequest;
  CL_RETURN_IF_ERROR(Default(&c, &R::samples_per_cell, &R::set_samples_per_cell, 128, "samples_per_cell", 8, 4096));
  CL_RETURN_IF_ERROR(Default(&c, &R::p3_samples, &R::set_p3_samples, 512, "p3_samples", 16, 8192));
  CL_RETURN_IF_ERROR(Default(&c, &R::steering_samples, &R::set_steering_samples, 2000, "steering_samples", 16, 100000));
  CL_RETURN_IF_ERROR(Default(&c, &R::steering_est_samples, &R::set_steering_est_samples, 256, "steering_est_samples",
                             16, 8192));
  CL_RETURN_IF_ERROR(Default(&c, &R::ood_tasks, &R::set_ood_tasks, 32, "ood_tasks", 2, 4096));
  CL_RETURN_IF_ERROR(Default(&c, &R::ood_samples, &R::set_ood_samples, 16, "ood_samples", 1, 1024));
  CL_RETURN_IF_ERROR(Default(&c, &R::kl_samples, &R::set_kl_samples, 512, "kl_samples", 16, 65536));
  CL_RETURN_IF_ERROR(HookKind("dissociation_hook", c.mutable_dissociation_hook(), "post_attn"));
  CL_RETURN_IF_ERROR(Default(&c, &R::probe_samples, &R::set_probe_samples, 1000, "probe_samples", 64, 65536));
  CL_RETURN_IF_ERROR(Default(&c, &R::eval_samples, &R::set_eval_samples, 200, "eval_samples", 16, 65536));
  CL_RETURN_IF_ERROR(Default(&c, &R::opt_steps, &R::set_opt_steps, 200, "opt_steps", 1, 5000));
  CL_RETURN_IF_ERROR(Default(&c, &R::stats_samples, &R::set_stats_samples, 500, "stats_samples", 16, 65536));
  CL_RETURN_IF_ERROR(Range("task_rank", c.task_rank(), 0, 16));
  CL_RETURN_IF_ERROR(Default(&c, &R::dyck_masks, &R::set_dyck_masks, 10, "dyck_masks", 1, 100));
  CL_RETURN_IF_ERROR(Default(&c, &R::dyck_prefix, &R::set_dyck_prefix, 3, "dyck_prefix", 1, 16));
  if (c.steering_subtract().empty()) c.set_steering_subtract("true_task");
  if (c.steering_subtract() != "true_task" && c.steering_subtract() != "projection") {
    return absl::InvalidArgumentError("steering_subtract must be true_task or projection, got " +
                                      Quote(c.steering_subtract()));
  }
  if (c.protect().empty()) c.set_protect("task");
  if (c.protect() != "task" && c.protect() != "task_and_tokens") {
    return absl::InvalidArgumentError("protect must be task or task_and_tokens, got " + Quote(c.protect()));
  }
  if (!c.has_stats_begin()) c.set_stats_begin(0);
  if (c.opt_target().empty()) c.set_opt_target("minor");
  if (c.opt_target() != "minor" && c.opt_target() != "ood") {
    return absl::InvalidArgumentError("opt_target must be minor or ood, got " + Quote(c.opt_target()));
  }
  if (c.p_common() == 0) c.set_p_common(0.9);
  if (!(c.p_common() > 0 && c.p_common() < 1)) {
    return absl::InvalidArgumentError("p_common must be in (0, 1) (0 = default 0.9), got " +
                                      std::to_string(c.p_common()));
  }
  if (c.positions_size() > kMaxPositions) {
    return absl::InvalidArgumentError("positions must have at most " + std::to_string(kMaxPositions) +
                                      " entries, got " + std::to_string(c.positions_size()));
  }
  return absl::OkStatus();
}

// The target's model and sequence length hold the layers and positions asked.
absl::Status CheckTarget(const Target& t, const v1::AnalyzeTaskVectorsRequest& c) {
  const uint32_t layers = t.spec.model().decoder().num_layers();
  // Positions, or a regression prompt's points (the state at the |- before y_i).
  const engine::TaskVectorSites sites = engine::SpecFamilyOf(t.spec).TaskVectorSitesOf(t.spec);
  const uint32_t last = sites.last;
  const std::string who = " (" + FormatRunId(t.id) + " has " + std::to_string(layers) + " layers, " + sites.unit +
                          " 0 to " + std::to_string(last) + ")";
  // Layers count from 1, as on every surface (docs/concepts/naming.md).
  for (int i = 0; i < c.layers_size(); ++i) {
    if (c.layers(i) < 1 || c.layers(i) > layers) {
      return absl::InvalidArgumentError("layers[" + std::to_string(i) + "] must be in [1, " + std::to_string(layers) +
                                        "] (layers count from 1), got " + std::to_string(c.layers(i)) + who);
    }
  }
  if (c.has_dissociation_layer() && (c.dissociation_layer() < 1 || c.dissociation_layer() > layers)) {
    return absl::InvalidArgumentError("dissociation_layer must be in [1, " + std::to_string(layers) +
                                      "] (layers count from 1), got " + std::to_string(c.dissociation_layer()) + who);
  }
  if (c.task_rank() > t.spec.task().latent().num_majors()) {
    return absl::InvalidArgumentError("task_rank must be at most the number of major tasks (" +
                                      std::to_string(t.spec.task().latent().num_majors()) + "), got " +
                                      std::to_string(c.task_rank()) + who);
  }
  if (c.has_steering_layer() && (c.steering_layer() < 1 || c.steering_layer() > layers)) {
    return absl::InvalidArgumentError("steering_layer must be in [1, " + std::to_string(layers) +
                                      "] (layers count from 1), got " + std::to_string(c.steering_layer()) + who);
  }
  for (int i = 0; i < c.positions_size(); ++i) {
    if (c.positions(i) > last) {
      return absl::InvalidArgumentError("positions[" + std::to_string(i) + "] must be in [0, " +
                                        std::to_string(last) + "], got " + std::to_string(c.positions(i)) + who);
    }
  }
  for (auto [field, has, v] : {std::tuple{"est_begin", c.has_est_begin(), c.est_begin()},
                               std::tuple{"est_end", c.has_est_end(), c.est_end()},
                               std::tuple{"steer_begin", c.has_steer_begin(), c.steer_begin()},
                               std::tuple{"steer_end", c.has_steer_end(), c.steer_end()},
                               std::tuple{"probe_begin", c.has_probe_begin(), c.probe_begin()},
                               std::tuple{"stats_begin", c.has_stats_begin(), c.stats_begin()}}) {
    if (has && v > last) {
      return absl::InvalidArgumentError(std::string(field) + " must be in [0, " + std::to_string(last) +
                                        "], got " + std::to_string(v) + who);
    }
  }
  if (c.has_est_begin() && c.has_est_end() && c.est_begin() > c.est_end()) {
    return absl::InvalidArgumentError("est_begin must be at most est_end, got " + std::to_string(c.est_begin()) +
                                      " > " + std::to_string(c.est_end()));
  }
  if (c.has_steer_begin() && c.has_steer_end() && c.steer_begin() > c.steer_end()) {
    return absl::InvalidArgumentError("steer_begin must be at most steer_end, got " +
                                      std::to_string(c.steer_begin()) + " > " + std::to_string(c.steer_end()));
  }
  return absl::OkStatus();
}

absl::StatusOr<AnalysisPlan<v1::AnalyzeTaskVectorsResponse>> PlanTaskVectors(
    AnalysisCore& core, const v1::AnalyzeTaskVectorsRequest& request) {
  const bool sweep = !request.sweep_id().empty();
  if (sweep == !request.run_id().empty()) return absl::InvalidArgumentError("give run_id or sweep_id (one of them)");
  if (sweep && (request.step() != 0 || request.all_checkpoints())) {
    return absl::InvalidArgumentError("step and all_checkpoints apply to a run_id; a sweep is analysed at the newest "
                                      "checkpoint of each run");
  }
  if (request.all_checkpoints() && request.step() != 0) {
    return absl::InvalidArgumentError("give step or all_checkpoints, not both");
  }
  std::vector<Target> targets;
  int64_t store_id = store::Store::kNoRun;
  if (sweep) {
    CL_ASSIGN_OR_RETURN(targets, SweepTargets(&core.store(), request.sweep_id()));
  } else {
    CL_ASSIGN_OR_RETURN(Target t, RunTarget(&core.store(), request));
    store_id = t.id;
    targets.push_back(std::move(t));
  }

  // The canonical request: defaults filled in, force dropped.
  v1::AnalyzeTaskVectorsRequest c = request;
  c.clear_force();
  CL_RETURN_IF_ERROR(CanonicalAnalyses(request, targets, &c));
  CL_RETURN_IF_ERROR(FillDefaults(request, &c));
  if (c.seed() == 0 && !sweep) c.set_seed(targets[0].spec.seed());
  uint64_t memory = 0;  // what admission counts for the job
  for (const Target& t : targets) {
    CL_RETURN_IF_ERROR(CheckTarget(t, c));
    const uint64_t need = EstimateBytes(t.spec, c);
    // Targets run one after the other: the job holds the largest at once.
    memory = std::max(memory, engine::EstimateRunMemoryBytes(t.spec) + need);
    if (need > core.limits().max_run_memory_bytes) {
      return absl::ResourceExhaustedError(
          "this analysis keeps about " + std::to_string(need >> 20) + " MiB of hidden states for " +
          FormatRunId(t.id) + ", more than this server's --max-run-memory-mb (" +
          std::to_string(core.limits().max_run_memory_bytes >> 20) +
          " MiB); lower samples_per_cell, p3_samples, steering_samples, ood_tasks or ood_samples, or ask fewer layers");
    }
  }

  // The key: the canonical request and exactly which checkpoints it covers.
  std::string key = c.SerializeAsString();
  int64_t total = 0;
  for (const Target& t : targets) {
    absl::StrAppend(&key, "|", FormatRunId(t.id));
    for (int64_t s : t.steps) absl::StrAppend(&key, ":", s);
    total += static_cast<int64_t>(t.steps.size());
  }
  AnalysisPlan<v1::AnalyzeTaskVectorsResponse> plan;
  plan.run_id = store_id;
  plan.key = std::move(key);
  plan.version = kLayersFromOne;
  // P0-P2's cells draw their own sequences per (token, task) since issue 50
  // (SCIENCE.md G.9 (6)): answers stored before are recomputed, not served.
  if (Asks(c, "p0") || Asks(c, "p1") || Asks(c, "p2")) plan.version += "/cells-per-token";
  plan.memory_bytes = memory;
  plan.work = [store = &core.store(), analyzer = &core.analyzer(), targets, c, total](
                  const std::function<void(double)>& progress,
                  const CancelToken* cancel) -> absl::StatusOr<v1::AnalyzeTaskVectorsResponse> {
    v1::AnalyzeTaskVectorsResponse done;
    *done.mutable_request() = c;
    int64_t finished = 0;
    for (const Target& t : targets) {
      v1::AnalyzeTaskVectorsRequest req = c;
      if (req.seed() == 0) req.set_seed(t.spec.seed());  // a sweep's runs: each its own seed
      for (int64_t step : t.steps) {
        CL_ASSIGN_OR_RETURN(std::optional<store::Checkpoint> ckpt, store->CheckpointAt(t.id, step));
        if (!ckpt) {
          return absl::NotFoundError("checkpoint " + std::to_string(step) + " of " + FormatRunId(t.id) +
                                     " is gone (deleted by keep_checkpoints?)");
        }
        auto sub = [&](double f) {
          if (progress) progress((static_cast<double>(finished) + f) / static_cast<double>(total));
        };
        const engine::AnalysisInput input{t.spec, {{step, std::move(ckpt->bytes)}}, {}};
        CL_ASSIGN_OR_RETURN(v1::AnalyzeTaskVectorsResponse r,
                            engine::Analyze<v1::AnalyzeTaskVectorsResponse>(*analyzer, input, req, sub, cancel));
        for (v1::TaskVectorValue& v : *r.mutable_values()) {
          v.set_run_id(FormatRunId(t.id));
          v.set_step(static_cast<uint64_t>(step));
          v.set_sweep_values(t.sweep_values);
          *done.add_values() = std::move(v);
        }
        ++finished;
      }
    }
    return done;
  };
  // A pending answer shows the request as resolved (the CLI prints it).
  plan.on_answer = [c](v1::AnalyzeTaskVectorsResponse* resp) { *resp->mutable_request() = c; };
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("task_vectors", v1::AnalyzeTaskVectorsRequest, v1::AnalyzeTaskVectorsResponse,
                        PlanTaskVectors);

}  // namespace circuitlab::scheduler
