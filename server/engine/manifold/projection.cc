#include "server/engine/manifold/projection.h"

namespace circuitlab::engine {

Projection Project(const Projector& projector, const ImirModel& model, int64_t member) {
  torch::NoGradGuard no_grad;  // coordinate models materialise their matrices here
  std::vector<torch::Tensor> kq;
  for (int64_t l = 0; l < model.config().layers; ++l) kq.push_back(model.kq(l)[member]);
  return projector.ProjectTensors(kq, model.readout()[member]);
}

void LoadProjected(const Projector& projector, const Projection& projection, ImirModel& target, int64_t member) {
  const DenseWeights w = projector.OnManifold(projection, target.config().layers, target.config().heads, target.d0(),
                                              target.config().vocab);
  target.AssignDense(member, w.kq, w.readout);
}

Projection Project(const ImirModel& model, int64_t member, const Basis& basis) {
  return Project(Projector(basis), model, member);
}

void LoadProjected(const Basis& basis, const Projection& projection, ImirModel& target, int64_t member) {
  LoadProjected(Projector(basis), projection, target, member);
}

}  // namespace circuitlab::engine
