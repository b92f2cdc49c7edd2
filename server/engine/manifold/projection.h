// Projection of whole IMIR models (ensemble members) onto a basis, and back:
// the tensor projector (basis/projector.h) applied to a model's weights.
#pragma once

#include "server/engine/basis/projector.h"
#include "server/engine/models/imir_model.h"

namespace circuitlab::engine {

// Projects ensemble member `member` of `model`.
Projection Project(const Projector& projector, const ImirModel& model, int64_t member);
// Overwrites member `member` of `target` with the on-manifold part W_S of
// `projection` (a model of the projector's shape).
void LoadProjected(const Projector& projector, const Projection& projection, ImirModel& target, int64_t member);

// One-off conveniences (build a Projector each call).
Projection Project(const ImirModel& model, int64_t member, const Basis& basis);
void LoadProjected(const Basis& basis, const Projection& projection, ImirModel& target, int64_t member);

}  // namespace circuitlab::engine
