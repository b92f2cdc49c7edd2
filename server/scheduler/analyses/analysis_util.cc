#include "server/scheduler/analyses/analysis_util.h"

#include "server/engine/spec.h"

namespace circuitlab::scheduler {

engine::Selection ToSelection(v1::BasisSelection s) {
  return s == v1::BASIS_SELECTION_COMPLETE ? engine::Selection::kComplete : engine::Selection::kPaper;
}

absl::Status CheckSelection(v1::BasisSelection s) {
  if (!v1::BasisSelection_IsValid(s)) {
    return absl::InvalidArgumentError("selection is not a known value: " + std::to_string(s));
  }
  return absl::OkStatus();
}

void FillCoordinate(const store::CoordinateDefRow& d, double value, v1::Coordinate* c) {
  c->set_label(d.label);
  c->set_canonical(d.canonical);
  c->set_matrix(d.matrix);
  c->set_layer(static_cast<uint32_t>(d.layer));
  c->set_head(static_cast<uint32_t>(d.head));
  c->set_block_q(d.block_q);
  c->set_block_k(d.block_k);
  c->set_element(d.element);
  c->set_value(value);
  c->set_magnitude(value * d.norm);
  c->set_gauge(d.gauge);
}

absl::Status NeedsCoordinates(const v1::ExperimentSpec& spec, const std::string& what) {
  const engine::SpecFamily& family = engine::SpecFamilyOf(spec);
  if (family.has_coordinates()) return absl::OkStatus();
  return absl::FailedPreconditionError(what + " needs an IMIR model (model.imir); this run trains model.decoder on "
                                       "task.latent (the " + std::string(family.name()) +
                                       " family, no IMIR coordinates): ask AnalyzeTaskVectors (circuitlab "
                                       "task-vectors)");
}

uint64_t JobMemory(const v1::ExperimentSpec& spec, uint64_t extra) {
  return engine::EstimateRunMemoryBytes(spec) + extra;
}

absl::Status CheckEvalSize(uint32_t n, uint32_t min, const std::string& field) {
  if (n != 0 && (n < min || n > kMaxEval)) {
    return absl::InvalidArgumentError(field + " must be in [" + std::to_string(min) + ", " + std::to_string(kMaxEval) +
                                      "] (0 = default), got " + std::to_string(n));
  }
  return absl::OkStatus();
}

}  // namespace circuitlab::scheduler
