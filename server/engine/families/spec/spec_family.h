// Model families, torch-free (SCIENCE.md B.1, B.2): what resolving a spec,
// estimating a run and validating an analysis request need to know of a
// run's family. `imir` is the block model on the synthetic tasks (IMIR
// coordinates, circuits, labels); `latent` the decoder on a DICE, MARKOV or
// DYCK latent task (task vectors, hook-point interventions); `regression`
// the decoder on continuous-token regression (E2).
//
// `ResolveFamily` and `SpecFamilyOf` are the one place that tells the
// families apart by the spec's model and task kinds; everything else asks
// the family (its defaults, its rules, its sizes, what it has). The torch
// half (trainers, recorders, metric names) is families/family.h; which
// analyses a family answers is the analysis table's (analysis/registry.h).
// One file per family here too: imir_spec.cc, latent_spec.cc,
// regression_spec.cc (the two decoder families share decoder_spec.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/spec.pb.h"

namespace circuitlab::engine {

// Most coordinates an IMIR basis may have (recorded or parameterising a
// model): ResolveSpec refuses more, and the server refuses a worker's basis
// report beyond it.
constexpr int64_t kMaxBasisCoordinates = 200000;

// Sequences evaluated (and sampled) per forward pass: bounds evaluation
// memory; the memory estimates assume it.
inline constexpr int64_t kEvalChunk = 512;
// The same for the decoder models of latent tasks (T x T attention per head).
inline constexpr int64_t kLatentEvalChunk = 128;

// A family's training and recording defaults (spec.proto documents them per
// family) and the loss it trains with.
struct FamilyDefaults {
  v1::OptimizerKind optimizer = v1::OPTIMIZER_KIND_SGD;
  double adam_learning_rate = 1e-3;  // SGD's default is 2.0 in every family
  uint32_t batch_size = 256;
  v1::LrSchedule schedule = v1::LR_SCHEDULE_CONSTANT;
  double grad_clip = 0.0;
  v1::LossKind loss = v1::LOSS_KIND_CROSS_ENTROPY;
  // The family trains with `loss` only (why, for the error); null: any loss.
  const char* loss_only = nullptr;
  uint32_t eval_size = 2048;
};

// Where a task-vector analysis of a run reads its states: positions of the
// sequence, or the points of a regression prompt.
struct TaskVectorSites {
  uint32_t last = 0;               // highest index a request may name
  const char* unit = "positions";  // "positions" or "points"
};

class SpecFamily {
 public:
  virtual ~SpecFamily() = default;
  virtual std::string_view name() const = 0;
  virtual const FamilyDefaults& defaults() const = 0;

  // The family's own task fields (the latent kinds' fields), defaults filled
  // and checked; the task's kind is already resolved.
  virtual absl::Status ResolveTask(v1::ExperimentSpec* spec) const { return absl::OkStatus(); }
  // The model's defaults filled and checked (model.imir or model.decoder).
  virtual absl::Status ResolveModel(v1::ExperimentSpec* spec) const = 0;
  // recording.coordinates_every and complete_coordinates: defaulted and
  // checked (`given`: the spec set coordinates_every itself).
  virtual absl::Status ResolveCoordinateRecording(v1::ExperimentSpec* spec, bool given) const = 0;

  // Width of the residual stream of a resolved spec's model.
  virtual int64_t ResidualWidth(const v1::ExperimentSpec& resolved) const = 0;
  // Trainable parameters of a resolved spec's model.
  virtual int64_t ParameterCount(const v1::ExperimentSpec& resolved) const = 0;
  // Rough upper estimate of a training step's and an evaluation chunk's
  // memory (parameters, gradients, optimiser state, kept activations).
  virtual uint64_t EstimateRunMemoryBytes(const v1::ExperimentSpec& resolved) const = 0;
  // Attention heads per layer.
  virtual int64_t NumHeads(const v1::ExperimentSpec& resolved) const = 0;
  // Width of a continuous token fed to the model's read-in; 0 when the model
  // embeds token ids.
  virtual int64_t ContinuousInputWidth(const v1::ExperimentSpec& resolved) const { return 0; }

  // The run's weights have IMIR coordinates (projections, circuits, labels,
  // coordinate edits).
  virtual bool has_coordinates() const { return false; }
  // Whether members of `resolved` packed into one ensemble step train faster
  // than one after another on a CPU slot, as measured (bench/RESULTS.md,
  // "Packing decoder sweep members"): IMIR steps at batch <= 32 1.00-1.25x,
  // at 64 and 256 0.92-0.94x; the decoders' 0.77-0.95x (their step is
  // GEMM-bound; packing only grows the working set). The scheduler packs CPU
  // members only where it pays; CUDA slots always may.
  virtual bool PacksOnCpu(const v1::ExperimentSpec& resolved) const { return false; }
  // Clears from a pack key (PackKey) the settings each member of a pack may
  // have its own: those that keep every shape (and a coordinate model's
  // basis) and that the family's trainer reads per member. The seed by
  // default.
  virtual void ClearMemberSettings(v1::ExperimentSpec* key) const { key->clear_seed(); }
  // The run's hidden states carry task vectors (AnalyzeTaskVectors).
  virtual bool has_task_vectors() const { return false; }
  // Whether `analysis` (AnalyzeTaskVectorsRequest.analyses: "p0", "p2",
  // "steering", ...) applies to the resolved task, and what "all" means.
  virtual bool OffersTaskVectorAnalysis(const std::string& analysis, const v1::LatentTask& task) const { return false; }
  virtual TaskVectorSites TaskVectorSitesOf(const v1::ExperimentSpec& resolved) const { return {}; }
};

// The family of a spec whose task kind is set: fills the model's kind when
// unset (model.decoder for task.latent, else model.imir) and the latent
// task's kind (DICE), and refuses a model that cannot train the task.
absl::StatusOr<const SpecFamily*> ResolveFamily(v1::ExperimentSpec* spec);

// The family of a resolved (or stored) spec.
const SpecFamily& SpecFamilyOf(const v1::ExperimentSpec& resolved);

// The three families (imir_spec.cc, latent_spec.cc, regression_spec.cc).
const SpecFamily& ImirSpecFamily();
const SpecFamily& LatentSpecFamily();
const SpecFamily& RegressionSpecFamily();

}  // namespace circuitlab::engine
