// The run loop: one pack of members (one TrainRequest each) from a fresh
// start or a checkpoint to its last step, reporting to each member's
// observer: metrics, evaluations, IMIR coordinates and rho at recording
// steps, progress (about twice a second), checkpoints; early stops
// (training.stop_metric), cancellation of single members, and a drain's
// preemption (every member checkpoints). Engine-private (includes LibTorch).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/engine.h"

namespace circuitlab::engine {

// One ensemble member per request (SCIENCE.md 0.3: member e trains as a
// one-member run with its seed would). A pack holds fresh runs whose specs
// differ only in their seed; a resumed run trains alone. LibTorch's
// exceptions propagate (the executor turns them into statuses).
absl::StatusOr<std::vector<TrainOutcome>> TrainMembers(const std::vector<TrainRequest>& requests,
                                                       const std::vector<TrainObserver*>& observers);

}  // namespace circuitlab::engine
