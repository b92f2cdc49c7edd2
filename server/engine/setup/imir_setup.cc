#include "server/engine/setup/imir_setup.h"

#include <string>
#include <vector>

#include "server/common/seeds.h"
#include "server/engine/basis/basis.h"
#include "server/engine/setup/checkpoint_io.h"

namespace circuitlab::engine {

uint64_t EvalSeed(uint64_t seed, SampleMode mode) {
  return DeriveSeed63(seed, "eval", static_cast<uint64_t>(mode));
}

void InitializeModel(const std::vector<v1::ExperimentSpec>& members, ImirModel& model) {
  std::vector<uint64_t> init_seeds;
  for (const v1::ExperimentSpec& member : members) init_seeds.push_back(InitSeedOf(member.seed()));
  const auto& m = members.at(0).model().imir();
  if (!model.coordinate_model()) {
    model.Initialize(init_seeds);
    return;
  }
  if (m.init() == v1::INIT_SCHEME_PROJECTED) {
    // The FULL model's NORMAL init of the same seeds, projected.
    ImirModelConfig full = model.config();
    full.coordinates = nullptr;
    full.zero_init = false;
    ImirModel dense(full, model.ensemble(), torch::kCPU);
    dense.Initialize(init_seeds);
    for (int64_t e = 0; e < model.ensemble(); ++e) {
      std::vector<torch::Tensor> kq;
      for (int64_t l = 0; l < full.layers; ++l) kq.push_back(dense.kq(l)[e].detach());
      model.AssignDense(e, kq, dense.readout()[e].detach());
    }
  } else {
    model.Initialize(init_seeds);
  }
  const Basis& basis = model.config().coordinates->basis;
  for (int64_t e = 0; e < model.ensemble(); ++e) {
    for (const auto& [name, value] : members[static_cast<size_t>(e)].model().imir().initial_coordinates()) {
      const int32_t id = FindCoordinate(basis, name);
      if (id >= 0) model.SetRawCoordinate(e, id, value);  // ResolveSpec rejected unknown names
    }
  }
}

absl::Status LoadWeights(const std::string& checkpoint, ImirModel& model) {
  return LoadWeights(checkpoint, model.parameter_names(), model.parameters());
}

}  // namespace circuitlab::engine
