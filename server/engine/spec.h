// Validation and default resolution of an ExperimentSpec (torch-free).
//
// ResolveSpec fills every unset optional field with its documented default
// (see proto/circuitlab/v1/spec.proto) and checks every field. The first
// problem is returned as
//   InvalidArgument("task.associative_recall.num_blocks must be in [1, 256], got 0")
// naming the field path as it appears in the JSON spec, the allowed range and
// the value. Specs that are valid but too big for this server's limits answer
// ResourceExhausted, naming the limit.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "circuitlab/v1/spec.pb.h"
#include "server/engine/families/spec/imir_spec.h"    // CoordinateBasisOf, TrainedCoordinates
#include "server/engine/families/spec/spec_family.h"  // SpecFamilyOf, kEvalChunk, kMaxBasisCoordinates
#include "server/engine/tasks/catalog.h"              // TaskShape, ShapeOf

namespace circuitlab::engine {

struct EngineLimits {
  // Most optimisation steps one run may ask for.
  uint64_t max_steps = 10'000'000;
  // Most memory one run may need (estimated; see EstimateRunMemoryBytes).
  uint64_t max_run_memory_bytes = 4ULL << 30;
};

// Fills defaults in place and validates. On error `spec` may be partly
// resolved.
absl::Status ResolveSpec(const EngineLimits& limits, v1::ExperimentSpec* spec);

// Residual width of a resolved spec's model: d_L = (H+1)^L (V+P) for IMIR,
// d_model for a decoder. This and the two below ask the spec's family.
int64_t ResidualWidth(const v1::ExperimentSpec& resolved);

// Trainable parameters of a resolved spec's model.
int64_t ParameterCount(const v1::ExperimentSpec& resolved);

// Rough upper estimate of the memory a training step and an evaluation chunk
// of a resolved spec need: parameters with gradients and optimiser state, and
// the activations autograd keeps.
uint64_t EstimateRunMemoryBytes(const v1::ExperimentSpec& resolved);

// What decides whether resolved specs can train as one ensemble: the spec
// without its name, tags, resources and the settings its family lets each
// member have its own (SpecFamily::ClearMemberSettings: the seed, but for a
// coordinate model whose basis it draws; IMIR initial coordinates; the
// decoders' kappa and p_minor), deterministically serialized.
std::string PackKey(const v1::ExperimentSpec& resolved);
// PackKey(a) == PackKey(b).
bool PackableTogether(const v1::ExperimentSpec& a, const v1::ExperimentSpec& b);

}  // namespace circuitlab::engine
