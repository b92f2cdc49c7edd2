// The IMIR family's coordinate system, torch-free (SCIENCE.md B.1, C.3): the
// basis a COORDINATES model is parameterised on and the coordinates it
// trains. The family itself is ImirSpecFamily() (spec_family.h).
#pragma once

#include <cstdint>
#include <vector>

#include "circuitlab/v1/spec.pb.h"
#include "server/engine/basis/basis.h"

namespace circuitlab::engine {

// The model's coordinate basis (COORDINATES parameterisation): the spec's
// coordinate_basis built on the task's declared symmetry.
Basis CoordinateBasisOf(const v1::ExperimentSpec& resolved);

// Indices into CoordinateBasisOf of the trained coordinates, in basis order
// (all when the spec lists none). The spec must be resolved.
std::vector<int32_t> TrainedCoordinates(const v1::ExperimentSpec& resolved, const Basis& basis);

}  // namespace circuitlab::engine
