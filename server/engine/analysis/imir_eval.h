// What the IMIR analyses (SCIENCE.md D.1 detection, D.2/D.3 labels, D.6
// weight-space interventions) share: a checkpoint opened as dense weights
// with its coordinates, evaluation sets, logits and metrics, coordinate
// edits and head ablations. Engine-private (LibTorch).
//
// Every analysis works on dense copies of a checkpoint's weights (a FULL
// model with one member), whatever the run's parameterisation: a coordinate
// vector c over a basis becomes weights through the projector
// (W_S(c) = sum_a c_a B_a), an edit of coordinates becomes W + W_S(c') -
// W_S(c) (so a FULL model keeps its off-manifold part), and a head ablation
// zeroes the weight blocks that read the head's output or any copy of it,
// which is exactly zeroing the head's output block Y_{l,h}.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/analysis/activation_ops.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/models/imir_model.h"
#include "server/engine/tasks/block_task.h"

namespace circuitlab::engine {

// The engine's basis selection of a request's (UNSPECIFIED means PAPER; the
// scheduler resolves every request's selection before it gets here).
inline Selection SelectionOf(v1::BasisSelection s) {
  return s == v1::BASIS_SELECTION_COMPLETE ? Selection::kComplete : Selection::kPaper;
}

// Sequences per forward pass (bounds activation memory).
constexpr int64_t kImirChunk = 1024;

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

// A FULL one-member model of the task's shape, and a copy of member 0 of
// `model` (either parameterisation) into one.
std::unique_ptr<ImirModel> DenseLike(const BlockTask& task, int64_t layers, int64_t heads);
void CopyDense(const ImirModel& model, ImirModel& dense);

// A checkpoint as a FULL one-member model (whatever the run's
// parameterisation), with the run's task (its own pool).
struct DenseCheckpoint {
  std::unique_ptr<BlockTask> task;
  std::unique_ptr<ImirModel> dense;
};
absl::StatusOr<DenseCheckpoint> OpenDense(const v1::ExperimentSpec& spec, const std::string& checkpoint);

// The checkpoint over its own coordinate basis (COORDINATES runs) or the
// `selection` basis of its task (FULL runs).
absl::StatusOr<Opened> Open(const v1::ExperimentSpec& spec, const std::string& checkpoint, Selection selection);

// One evaluation set's sequences.
struct EvalData {
  std::string name, alt_name;
  torch::Tensor tokens, pids, target, alt_target;  // [1, B, T] / [B]
};
// InvalidArgument listing the task's sets when `name` is not one of them.
absl::StatusOr<EvalData> MakeEval(const BlockTask& task, const std::string& name, int64_t n, uint64_t seed);

// The task's primary set for circuit metrics: icl_rare for associative
// recall, else the first evaluation set.
std::string PrimaryEvalSet(const v1::ExperimentSpec& spec);

// Logits at the query [B, V] (float64), in chunks; with `attention`, the
// query's attention row per layer [H, B, T].
torch::Tensor Logits(const ImirModel& model, const EvalData& d, std::vector<torch::Tensor>* attention = nullptr);

// Logits at the query [B, V] (float64) with the activation edits `ops`
// applied, in chunks; `meters` (when given) record attention mass.
torch::Tensor EditedLogits(const ImirModel& model, const EvalData& d, const std::vector<PreparedOp>& ops,
                           std::vector<AttentionMassMeter>* meters = nullptr);

// The tensor at an IMIR hook point (imir_model.h; layers and heads from 1).
absl::StatusOr<HookGeometry> ImirHookGeometry(const std::string& name, int64_t layers, int64_t heads, int64_t d0);

double Accuracy(const torch::Tensor& logits, const torch::Tensor& target);
double Loss(const torch::Tensor& logits, const torch::Tensor& target);

// Loads W_S(c) into `target`.
void LoadCoords(const Opened& o, const std::vector<double>& c, ImirModel& target);

// W + W_S(after) - W_S(before) over `projector`'s basis: the dense weights
// with their coordinates moved from `before` to `after`, the off-manifold
// part kept.
std::unique_ptr<ImirModel> MovedCoords(const Opened& o, const Projector& projector, const std::vector<double>& before,
                                       const std::vector<double>& after);

// Labels of the paper basis: the block written by head h (1-based) of layer
// i (1-based) as a path name, a key-query element, a readout element.
std::string HeadBlock(int64_t i, int64_t h, int64_t layers, int64_t heads);
std::string KqLabel(int64_t layer, int64_t head, const std::string& q, const std::string& k, const std::string& e);
std::string OutLabel(const std::string& block, const std::string& e);

// Zeroes, in `model`, every weight block that reads the output of head
// (layer, head) or a copy of it: KQ rows/columns of later layers and readout
// columns of blocks whose path passes through that head.
void AblateHead(ImirModel& model, int64_t layer, int64_t head);

// |c_a| ||B_a|| of the coordinate labelled `label` (0 when absent).
double Magnitude(const Basis& basis, const std::vector<double>& c, const std::string& label);

// A coordinate written into a response (value raw, magnitude value * norm).
void FillCoordinate(const CoordinateDef& d, double value, v1::Coordinate* out);

}  // namespace circuitlab::engine
