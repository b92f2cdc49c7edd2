// The engine's torch-free facade: what the scheduler (and tests) call to run
// training. Everything that touches tensors lives behind it in engine .cc
// files and engine-private headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/spec.pb.h"
#include "server/common/cancel.h"
#include "server/engine/analysis/data_dependence.h"
#include "server/engine/manifold/basis.h"
#include "server/engine/spec.h"

namespace circuitlab::engine {

struct Metric {
  std::string name;  // e.g. "train/loss", "eval/icl_rare/accuracy"
  double value = 0;
};

// Receives what a training run produces. Called on the training thread;
// implementations must not block for long (they slow training).
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  // Metrics recorded at `step` (1-based, after the step's update).
  virtual void OnMetrics(int64_t step, const std::vector<Metric>& metrics) = 0;
  // Progress after `step`, at most a few times a second.
  virtual void OnProgress(int64_t step, double steps_per_second) = 0;
  // A checkpoint of the state after `step`. An error fails the run.
  virtual absl::Status OnCheckpoint(int64_t step, const std::string& bytes) = 0;
  // The basis coordinates will be reported in; once per attempt, before any
  // OnCoordinates for it. An error fails the run.
  virtual absl::Status OnBasis(const Basis& basis) { return absl::OkStatus(); }
  // Coordinates (Basis::coords order) of the weights after `step`.
  virtual void OnCoordinates(int64_t step, Selection selection, const std::vector<double>& values) {}
};

struct TrainRequest {
  v1::ExperimentSpec spec;  // resolved (ResolveSpec)
  std::string device = "cpu";  // "cpu" or "cuda:N"
  // Resume from this checkpoint (bytes an earlier OnCheckpoint produced for
  // the same spec). The resumed run continues bit-for-bit on CPU.
  std::optional<std::string> resume_from;
  const CancelToken* cancel = nullptr;  // polled every step; may be null
  int intra_op_threads = 1;
};

enum class TrainEnd {
  kCompleted,  // every step ran; a final checkpoint was delivered
  kCancelled,  // stopped on a kCancel request
  kPreempted,  // stopped on a kPreempt request; a checkpoint of the last step was delivered
};

struct TrainOutcome {
  TrainEnd end = TrainEnd::kCompleted;
  int64_t last_step = 0;
};

// Runs training runs. Thread-safe: one instance serves every worker.
class Executor {
 public:
  virtual ~Executor() = default;
  // InvalidArgument for a checkpoint that does not belong to the spec,
  // Internal for failures inside LibTorch (the message says what failed).
  virtual absl::StatusOr<TrainOutcome> Train(const TrainRequest& request, TrainObserver& observer) = 0;
  // Several runs whose specs differ only in their seed (PackableTogether),
  // trained as one ensemble sharing every tensor op: one member per request,
  // each reporting to its own observer and writing its own checkpoints (the
  // ones a run alone would write, so it resumes alone). Requests must not
  // resume. A member whose token asks kCancel drops out (kCancelled), and one
  // that reaches its early stop ends there (kCompleted), while the others go
  // on; kPreempt on any member checkpoints and preempts them all.
  // One answer per request. The default trains them one after another.
  virtual std::vector<absl::StatusOr<TrainOutcome>> TrainPack(const std::vector<TrainRequest>& requests,
                                                              const std::vector<TrainObserver*>& observers) {
    std::vector<absl::StatusOr<TrainOutcome>> out;
    for (size_t i = 0; i < requests.size(); ++i) out.push_back(Train(requests[i], *observers[i]));
    return out;
  }
};

// The LibTorch executor.
std::unique_ptr<Executor> MakeTorchExecutor();

// A checkpoint's weights projected onto a basis (SCIENCE.md C.4).
struct CheckpointProjection {
  Basis basis;                                      // coords in order
  std::vector<double> values;                       // raw coefficient per coordinate
  double rho = 0;                                   // against `basis`
  std::vector<std::pair<std::string, double>> rho_by_matrix;
  double rho_complete = 0;                          // against the complete set
};

// One ladder of the invariance check (SCIENCE.md C.6).
struct InvarianceSeriesReport {
  std::string matrix;                // "all", "L1H1", ..., "OUT"
  std::vector<double> off_fraction;  // 1 - f_N per sample size
  double plateau = 0;                // fitted over points with 1 - f_N <= 0.1
  double slope = 0;                  // over the same points; NaN if fewer than 2
};

struct InvarianceCheckReport {
  std::string name;  // "in_span", "control_off_span", "control_no_relation"
  std::vector<InvarianceSeriesReport> series;  // "all" first
  double max_matrix_plateau() const {
    double m = 0;
    for (size_t i = 1; i < series.size(); ++i) m = std::max(m, series[i].plateau);
    return m;
  }
};

struct InvarianceRequest {
  Selection selection = Selection::kComplete;
  std::vector<int64_t> sample_sizes;
  double coordinate_std = 1.0;
  uint64_t seed = 1;
  bool controls = false;
  bool sgd_corollary = false;  // also C.6 item 7 (SGD from the point, plain and symmetrised)
};

// C.6 item 7 at one batch size.
struct SgdCorollaryReport {
  int64_t batch_size = 0;
  double rho = 0;              // off-span residual after the plain SGD steps
  double rho_symmetrised = 0;  // the same with symmetrised minibatch gradients
};

struct InvarianceReport {
  std::vector<int64_t> sample_sizes;
  std::vector<InvarianceCheckReport> checks;
  std::vector<SgdCorollaryReport> sgd;  // when requested
  int64_t sgd_steps = 0, sgd_group_elements = 0;
  double sgd_learning_rate = 0;
};

// ---- circuits (SCIENCE.md D.1-D.3, D.6) ----

// A metric measured on one evaluation set.
enum class CircuitMetric { kAccuracy, kLoss, kPTarget };

struct DetectRequest {
  std::string eval_set;  // "" = the task's primary ICL set
  int64_t n_eval = 2048;
  CircuitMetric metric = CircuitMetric::kAccuracy;
  double tolerance = 0.01;
  enum class Order { kMagnitudeAsc, kEffectAsc, kLabel } order = Order::kMagnitudeAsc;
  double prepass_eps = 1e-3;
  int max_passes = 3;
  Selection selection = Selection::kPaper;  // FULL models; COORDINATES use their own basis
  int64_t max_evals = 5000;
  uint64_t seed = 1;  // evaluation sequences
};

struct CircuitMember {
  CoordinateDef def;
  double value = 0;      // raw coefficient
  std::string role;      // "canonical", "shortcut", "aiding"
  double necessity = 0;  // m(K*) - m(K* \ {a}), positive = needed
  std::vector<double> irrelevant_mass_delta;  // aiding: per layer, without minus with
};

struct DetectReport {
  std::string eval_set;
  double m_dense = 0, m_ref = 0, m_circuit = 0;
  bool projection_not_faithful = false;
  std::vector<CircuitMember> circuit;  // by decreasing magnitude
  int64_t candidates = 0, evaluations = 0;
  bool budget_exhausted = false;
  std::string template_name;  // "induction_head", "two_hop_chain", "in_weights_memory", combos with '+', or ""
  std::vector<int> template_layers;
  struct Element {
    std::string label, canonical;
    bool found = false;
  };
  std::vector<Element> template_elements;
  std::vector<double> irrelevant_mass;  // per layer, with K*
};

// One intervention (D.6): weight-space edits of IMIR models, or activation
// edits at a hook point of decoder models (the kAct* kinds).
struct InterventionOp {
  enum class Kind {
    kZero, kScale, kSet, kAblateHead, kSwap, kKeepOnly,
    kActZero, kActMean, kActResample, kActProjectOut, kActProjectOnto, kActAdd, kActPatch, kActReplaceConvex
  } kind = Kind::kZero;
  bool activation() const { return kind >= Kind::kActZero; }
  std::vector<std::string> coordinates;  // labels or canonical names
  double scale = 1, value = 0;
  int layer = 0, head = 1;
  std::string source_checkpoint;   // kSwap: the other run's checkpoint
  v1::ExperimentSpec source_spec;  // kSwap: its spec (same vocabulary, positions, layers, heads)
  // kAct*: the hook point, rows (empty = all), head (0 = all; attn.* points),
  // vectors, reference set ("" = the evaluated set), centring.
  std::string hook;
  std::vector<int64_t> positions;
  std::vector<std::vector<double>> vectors;
  std::string reference_set;
  bool centre = false;
  // kActReplaceConvex: lambda (empty: Dirichlet(value) per sequence) and
  // "true_task" or "projection".
  std::vector<double> weights;
  std::string subtract;
};

// D.6 attention_mass (see AttentionMass in analysis_service.proto).
struct AttentionMassSpec {
  std::string pattern;
  std::vector<int64_t> keys, queries;
};

struct InterveneRequest {
  std::vector<InterventionOp> ops;
  std::vector<AttentionMassSpec> attention_mass;
  std::vector<int64_t> logit_diff_tokens;  // empty or (t1, t2): logit(t1) - logit(t2)
  std::vector<std::string> eval_sets;  // empty = all of the task's
  int64_t n_eval = 2048;
  uint64_t seed = 1;
  Selection selection = Selection::kPaper;
};

struct EffectReport {
  std::string eval_set, alt_name;
  double loss_clean = 0, loss = 0, accuracy_clean = 0, accuracy = 0, kl_clean = 0;
  bool has_logit_diff = false;
  double logit_diff_clean = 0, logit_diff = 0;
  // KL(p || q) against the set's reference law q (ref_name), clean and intervened.
  bool has_kl_ref = false;
  std::string ref_name;
  double kl_ref_clean = 0, kl_ref = 0;
  struct Mass {
    std::string pattern;
    std::vector<double> clean, intervened;  // per head
  };
  std::vector<Mass> attention_mass;  // one per requested AttentionMassSpec
};

struct InterveneReport {
  std::vector<EffectReport> effects;
  struct Edited {
    CoordinateDef def;
    double before = 0, after = 0;
  };
  std::vector<Edited> edited;
};

struct LabelRequest {
  int64_t n_eval = 1024;
  uint64_t seed = 1;
};

struct CheckpointLabelReport {
  int64_t step = 0;
  std::string icl_set;
  double icl_accuracy = 0, iwl_accuracy = 0;
  bool icl = false, iwl = false, coords_icl = false, coords_iwl = false, consistent = false;
  double conflict_logit_diff = 0;
  std::string label;
  std::string pair;
  std::vector<std::pair<std::string, double>> pair_scores;
  std::vector<double> head_ablation;
  std::vector<std::pair<std::string, double>> pair_ablation;  // set of pairs -> share removed
};

struct LabelReport {
  std::vector<CheckpointLabelReport> checkpoints;
  std::string label, pair, pair_predicted;
};

// ---- task-vector geometry (SCIENCE.md D.5, task.latent on model.decoder) ----

// Which analyses; each fills rows under its own prefix.
struct TaskVectorRequest {
  bool p0 = true, p1 = true, p2 = true, p3 = true, steering = true, ood_r2 = true, kl = true;
  // D.5.10-D.5.13 and E.20: probe, task-subspace removal, the optimised
  // orthogonal direction, the double-dissociation table, the statistics probe.
  bool dissociation = false;
  // D.5.14 / E.19 (DYCK only): residual variance at the planted positions
  // given the last `dyck_prefix` planted symbols and given the whole prefix
  // (the task), over `dyck_masks` shared planting masks, samples_per_cell
  // sequences per task per mask, on the majors and up to 32 minors.
  bool dyck_p0 = false;
  int64_t dyck_masks = 10;
  int dyck_prefix = 3;
  // Hidden states for P0-P3 and OOD R^2: this hook kind at every layer of
  // `layers` (empty = all): "post_mlp", "post_attn" or "resid_pre".
  std::string hook = "post_mlp";
  std::vector<int> layers;
  // P0/P1 positions (empty: 2, 4, 8, 16, 32 and the last below T-1).
  std::vector<int64_t> positions;
  // Token-conditioned sequences per (position, token, task) cell.
  int64_t samples_per_cell = 128;
  // Estimation window of the task vectors, inclusive (-1: the last
  // quarter of positions 0..T-2).
  int64_t est_begin = -1, est_end = -1;
  // P3: natural sequences per major.
  int64_t p3_samples = 512;
  // Steering (D.5.7): layer (-1 = last), the hooks the task vectors are
  // estimated at and injected at, sequences per major for the estimate,
  // evaluation samples, and the evaluation positions (inclusive; -1: T/3 to
  // 2T/3).
  int steering_layer = -1;
  std::string estimation_hook = "post_attn", injection_hook = "post_attn";
  // "true_task" (E1: h - theta_true(p) + sum alpha theta(p)) or "projection"
  // (E3: h - (h - mu) P_task + sum alpha theta_bar).
  std::string steering_subtract = "true_task";
  int64_t steering_est_samples = 256, steering_samples = 2000;
  int64_t steer_begin = -1, steer_end = -1;
  // OOD R^2 (D.5.8): fresh OOD tasks and sequences averaged per task (and
  // per major for the reference vectors).
  int64_t ood_tasks = 32, ood_samples = 16;
  // Mode transition (D.5.9): training-mixture sequences; the hybrid's
  // p_common (G.4: fixed 0.9).
  int64_t kl_samples = 512;
  double p_common = 0.9;
  // Dissociation: layer (-1 = last) and hook of the edits; probe sequences
  // and first probe position (-1: T/2); task-subspace rank (0: K-1 without
  // minors, K with them, G.4); evaluation sequences per group; V_opt's
  // optimisation (Adam 0.01, batch 32) steps and its target pool
  // ("minor", or "ood"; minor falls back to ood without minors); OOD
  // sequences of the statistics probe (E.20).
  int dissociation_layer = -1;
  std::string dissociation_hook = "post_attn";
  int64_t probe_samples = 1000, probe_begin = -1;
  int task_rank = 0;
  int64_t eval_samples = 200, opt_steps = 200;
  std::string opt_target = "minor";
  int64_t stats_samples = 500;
  uint64_t seed = 1;
};

// One number: analysis prefix/name, at a layer (-1: none) and a position
// (-1: none).
struct TaskVectorRow {
  std::string name;  // e.g. "p0/resid_ratio", "p3/r_mean/task0", "steering/kl_inj"
  int layer = -1;
  int64_t position = -1;
  double value = 0;
};

struct TaskVectorReport {
  std::vector<TaskVectorRow> rows;
};

// Pure analyses of stored checkpoints. Thread-safe.
class Analyzer {
 public:
  virtual ~Analyzer() = default;
  // InvalidArgument when the checkpoint does not fit the spec's model.
  virtual absl::StatusOr<CheckpointProjection> ProjectCheckpoint(const v1::ExperimentSpec& spec,
                                                                 const std::string& checkpoint,
                                                                 Selection selection) = 0;
  // The invariance check on the spec's task and model. `progress(fraction)`
  // is called as it goes; Cancelled when `cancel` stops it.
  virtual absl::StatusOr<InvarianceReport> CheckInvariance(const v1::ExperimentSpec& spec,
                                                           const InvarianceRequest& request,
                                                           const std::function<void(double)>& progress,
                                                           const CancelToken* cancel) = 0;
  // Circuit detection (D.1) on one checkpoint.
  virtual absl::StatusOr<DetectReport> DetectCircuit(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                     const DetectRequest& request,
                                                     const std::function<void(double)>& progress,
                                                     const CancelToken* cancel) = 0;
  // Interventions on one checkpoint; InvalidArgument names the op and
  // coordinate at fault.
  virtual absl::StatusOr<InterveneReport> Intervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                    const InterveneRequest& request) = 0;
  // Theorems 2 and 3 (D.4) on the spec's associative-recall task sizes.
  virtual absl::StatusOr<std::vector<DataDependenceRow>> CheckDataDependence(
      const v1::ExperimentSpec& spec, const std::vector<DataDependencePoint>& points,
      const DataDependenceConfig& config, const std::function<void(double)>& progress,
      const CancelToken* cancel) = 0;
  // Task-vector geometry (D.5) of one checkpoint of a decoder model on a
  // latent task. InvalidArgument for a hook or layer the model lacks,
  // FailedPrecondition for an analysis the task kind does not support.
  virtual absl::StatusOr<TaskVectorReport> AnalyzeTaskVectors(const v1::ExperimentSpec& spec,
                                                              const std::string& checkpoint,
                                                              const TaskVectorRequest& request,
                                                              const std::function<void(double)>& progress,
                                                              const CancelToken* cancel) {
    return absl::UnimplementedError("this analyzer has no task-vector analyses");
  }
  // D.2/D.3 labels of every checkpoint of a run, (step, bytes) ascending.
  virtual absl::StatusOr<LabelReport> LabelRun(const v1::ExperimentSpec& spec,
                                               const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                               const LabelRequest& request,
                                               const std::function<void(double)>& progress,
                                               const CancelToken* cancel) = 0;
};

std::unique_ptr<Analyzer> MakeTorchAnalyzer();

// CUDA devices LibTorch can use (0 on CPU-only builds).
int CudaDeviceCount();

// Process-wide runtime settings; call once at start-up before any training:
// BLAS threads (OpenBLAS) pinned to `blas_threads`, and glibc malloc
// thresholds raised so freed activation buffers are reused rather than
// returned to the OS every step.
void ConfigureRuntime(int blas_threads);

}  // namespace circuitlab::engine
