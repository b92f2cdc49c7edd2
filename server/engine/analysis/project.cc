// ProjectCheckpoint (SCIENCE.md C.4): an IMIR checkpoint's coordinates over
// the paper or complete basis of its task, and the off-manifold residual rho
// overall, per matrix and against the complete set.
#include "server/common/seeds.h"
#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/setup/imir_setup.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {

absl::StatusOr<v1::ProjectCheckpointResponse> ImirProject(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                          const v1::ProjectCheckpointRequest& request) {
  // The run's own task pool: its fixed pairing is the relation C.
  const std::unique_ptr<BlockTask> task = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
  const auto& m = spec.model().imir();
  const std::unique_ptr<ImirModel> model = MakeModel(spec, *task, 1, torch::kCPU);
  try {
    if (absl::Status s = LoadWeights(checkpoint, *model); !s.ok()) return s;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(std::string("cannot read the checkpoint: ") + e.what_without_backtrace());
  }
  const Selection selection = SelectionOf(request.selection());
  const TaskSymmetry sym = task->Symmetry();
  const Basis basis = BuildBasis(sym, m.num_layers(), m.num_heads(), selection);
  const Projection p = Project(*model, 0, basis);
  v1::ProjectCheckpointResponse out;
  out.set_selection(request.selection());
  for (const CoordinateDef& d : basis.coords)
    FillCoordinate(d, p.values[static_cast<size_t>(d.index)], out.add_coordinates());
  out.set_rho(p.rho());
  for (const MatrixNorms& n : p.matrices) (*out.mutable_rho_by_matrix())[n.matrix] = n.rho();
  out.set_rho_complete(
      selection == Selection::kComplete
          ? out.rho()
          : Project(*model, 0, BuildBasis(sym, m.num_layers(), m.num_heads(), Selection::kComplete)).rho());
  return out;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::ProjectCheckpointRequest, v1::ProjectCheckpointResponse,
                           [](const AnalysisInput& in, const v1::ProjectCheckpointRequest& r, const AnalysisProgress&, const CancelToken*) { return ImirProject(in.spec, in.checkpoint(), r); });

}  // namespace circuitlab::engine
