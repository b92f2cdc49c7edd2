// The run loop: one pack of members (one TrainRequest each) from a fresh
// start or a checkpoint to its last step, reporting to each member's
// observer: metrics, evaluations, IMIR coordinates and rho at recording
// steps, progress (about twice a second), checkpoints; early stops
// (training.stop_metric), cancellation of single members, and a drain's
// preemption (every member checkpoints). Engine-private (includes LibTorch).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/api.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {

// What a model family records beside the metrics at recording steps (the
// IMIR family: coordinates on its bases and the residuals rho).
class StepRecorder {
 public:
  virtual ~StepRecorder() = default;
  // Before the first step: what member `member`'s observer needs to read
  // its records.
  virtual absl::Status Announce(int64_t member, TrainObserver& observer) const = 0;
  // Whether `step` is a recording step (a member's last step always is).
  virtual bool Due(int64_t step) const = 0;
  // Member `member`'s records of `step`; metrics are appended to `metrics`.
  virtual void Record(int64_t step, int64_t member, TrainObserver& observer, std::vector<Metric>& metrics) const = 0;
};

// The members' specs: InvalidArgument unless `requests` is one run, or fresh
// runs whose specs may train together (a pack: PackableTogether).
absl::StatusOr<std::vector<v1::ExperimentSpec>> PackMembers(const std::vector<TrainRequest>& requests);

// One ensemble member per request (SCIENCE.md 0.3: member e trains as a
// one-member run of its spec would), on `trainer` (the family's, built
// for PackMembers(requests)); `recorder` may be null. LibTorch's exceptions
// propagate (the executor turns them into statuses).
absl::StatusOr<std::vector<TrainOutcome>> TrainMembers(const std::vector<TrainRequest>& requests,
                                                       const std::vector<TrainObserver*>& observers,
                                                       TrainerBase& trainer, const StepRecorder* recorder);

}  // namespace circuitlab::engine
