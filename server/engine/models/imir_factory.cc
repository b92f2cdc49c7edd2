#include "server/engine/models/imir_factory.h"

#include "server/engine/spec.h"

namespace circuitlab::engine {

std::unique_ptr<ImirModel> MakeModel(const v1::ExperimentSpec& spec, const BlockTask& task, int64_t ensemble,
                                     torch::Device device, bool float64) {
  const auto& m = spec.model().imir();
  ImirModelConfig cfg;
  cfg.vocab = task.vocab_size();
  cfg.positions = task.num_positions();
  cfg.layers = m.num_layers();
  cfg.heads = m.num_heads();
  cfg.zero_init = m.init() == v1::INIT_SCHEME_ZERO;
  cfg.init_std = m.init_std();
  cfg.float64 = float64;
  if (m.parameterisation() == v1::PARAMETERISATION_COORDINATES) {
    auto cc = std::make_shared<CoordinateConfig>();
    cc->basis =
        BuildBasis(task.Symmetry(), m.num_layers(), m.num_heads(),
                   m.coordinate_basis() == v1::BASIS_SELECTION_COMPLETE ? Selection::kComplete : Selection::kPaper);
    cc->trained = TrainedCoordinates(spec, cc->basis);
    cc->unit_norm = m.coordinate_scaling() != v1::COORDINATE_SCALING_RAW;
    cfg.coordinates = std::move(cc);
  }
  return std::make_unique<ImirModel>(cfg, ensemble, device);
}

}  // namespace circuitlab::engine
