#include "server/engine/train/run_loop.h"

#include <algorithm>
#include <chrono>

#include "server/common/cancel.h"
#include "server/engine/spec.h"

namespace circuitlab::engine {
namespace {

constexpr double kProgressIntervalSeconds = 0.5;

}  // namespace

absl::StatusOr<std::vector<v1::ExperimentSpec>> PackMembers(const std::vector<TrainRequest>& requests) {
  std::vector<v1::ExperimentSpec> members;
  for (const TrainRequest& r : requests) {
    if (requests.size() > 1 && (r.resume_from || !PackableTogether(r.spec, requests.front().spec))) {
      return absl::InvalidArgumentError(
          "a pack holds fresh runs whose specs differ only in their seed and their family's member settings");
    }
    members.push_back(r.spec);
  }
  return members;
}

namespace {

// Before the first step: each observer announced to the recorder, then the
// members resumed from their checkpoint or evaluated at step 0.
absl::Status StartMembers(const TrainRequest& request, const std::vector<TrainObserver*>& observers,
                          TrainerBase& trainer, const StepRecorder* recorder) {
  if (recorder != nullptr) {
    for (size_t e = 0; e < observers.size(); ++e) {
      if (absl::Status s = recorder->Announce(static_cast<int64_t>(e), *observers[e]); !s.ok()) return s;
    }
  }
  if (request.resume_from) return trainer.LoadCheckpoint(*request.resume_from);
  std::vector<std::vector<Metric>> initial = trainer.Evaluate();
  for (size_t e = 0; e < observers.size(); ++e) {
    if (recorder != nullptr) recorder->Record(0, static_cast<int64_t>(e), *observers[e], initial[e]);
    observers[e]->OnMetrics(0, initial[e]);
  }
  return absl::OkStatus();
}

// An evaluation step: each member's evaluation joins its points, and a live
// member whose training.stop_metric reached stop_at makes this step its last
// (*ends). InvalidArgument when the stop metric is not one of the task's.
template <typename Training>
absl::Status AddEvaluation(std::vector<std::vector<Metric>> eval, const std::vector<bool>& live,
                           const Training& training, std::vector<std::vector<Metric>>* points,
                           std::vector<bool>* ends) {
  const std::string& stop_metric = training.stop_metric();
  for (size_t e = 0; e < live.size(); ++e) {
    (*points)[e].insert((*points)[e].end(), eval[e].begin(), eval[e].end());
    if (stop_metric.empty() || !live[e]) continue;
    const auto it =
        std::find_if(eval[e].begin(), eval[e].end(), [&](const Metric& m) { return m.name == stop_metric; });
    if (it == eval[e].end()) {
      std::string have;
      for (const Metric& m : eval[e]) have += (have.empty() ? "" : ", ") + m.name;
      return absl::InvalidArgumentError("training.stop_metric '" + stop_metric +
                                        "' is not an evaluation metric of this task (" + have + ")");
    }
    // Early stop: this step becomes the member's last (final records, checkpoint).
    (*ends)[e] = (*ends)[e] || it->value >= training.stop_at();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TrainOutcome>> TrainMembers(const std::vector<TrainRequest>& requests,
                                                       const std::vector<TrainObserver*>& observers,
                                                       TrainerBase& trainer, const StepRecorder* recorder) {
  const TrainRequest& request = requests.front();
  const size_t E = requests.size();
  const v1::ExperimentSpec& spec = request.spec;
  const auto& rec = spec.recording();
  if (absl::Status s = StartMembers(request, observers, trainer, recorder); !s.ok()) return s;

  const int64_t total = trainer.total_steps();
  int64_t last_checkpoint = trainer.step();
  auto last_report = std::chrono::steady_clock::now();
  int64_t last_report_step = trainer.step();
  double rate = 0;
  std::vector<TrainOutcome> outcome(E);
  std::vector<bool> live(E, true);  // members still reporting (a cancelled member drops out)
  size_t live_count = E;

  auto save = [&](size_t e) -> absl::Status {
    const std::string bytes = E == 1 ? trainer.SaveCheckpoint() : trainer.SaveMemberCheckpoint(static_cast<int64_t>(e));
    return observers[e]->OnCheckpoint(trainer.step(), bytes);
  };
  auto finish = [&](TrainEnd end) {
    for (size_t e = 0; e < E; ++e) {
      if (live[e]) outcome[e] = TrainOutcome{end, trainer.step()};
    }
    return outcome;
  };

  while (trainer.step() < total) {
    for (size_t e = 0; e < E; ++e) {
      const CancelToken* cancel = requests[e].cancel;
      if (!live[e] || cancel == nullptr || !cancel->stop_requested()) continue;
      if (cancel->reason() == StopReason::kPreempt) {
        // A drain: every member checkpoints and goes back to the queue.
        if (trainer.step() != last_checkpoint) {
          for (size_t m = 0; m < E; ++m) {
            if (!live[m]) continue;
            if (absl::Status s = save(m); !s.ok()) return s;
          }
        }
        return finish(TrainEnd::kPreempted);
      }
      outcome[e] = TrainOutcome{TrainEnd::kCancelled, trainer.step()};
      live[e] = false;
      --live_count;
    }
    if (live_count == 0) return outcome;
    const int64_t next = trainer.step() + 1;
    const bool last = next == total;
    std::vector<bool> ends(E, last);  // a member's last step: the run's, or its early stop
    std::vector<std::vector<Metric>> points = trainer.Step(last || next % rec.metrics_every() == 0);
    points.resize(E);
    if (last || next % rec.eval_every() == 0) {
      if (absl::Status s = AddEvaluation(trainer.Evaluate(), live, spec.training(), &points, &ends); !s.ok()) return s;
    }
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last_report).count();
    const bool report = dt >= kProgressIntervalSeconds || last;
    if (report) {
      rate = dt > 0 ? static_cast<double>(next - last_report_step) / dt : rate;
      last_report = now;
      last_report_step = next;
    }
    const bool checkpoint_step = next % rec.checkpoint_every() == 0;
    if (checkpoint_step || last) last_checkpoint = next;
    for (size_t e = 0; e < E; ++e) {
      if (!live[e]) continue;
      if (recorder != nullptr && (ends[e] || recorder->Due(next))) {
        recorder->Record(next, static_cast<int64_t>(e), *observers[e], points[e]);
      }
      if (!points[e].empty()) observers[e]->OnMetrics(next, points[e]);
      if (report || ends[e]) observers[e]->OnProgress(next, rate);
      if (checkpoint_step || ends[e]) {
        if (absl::Status s = save(e); !s.ok()) return s;
      }
      if (ends[e] && !last) {  // stopped early; the others go on
        outcome[e] = TrainOutcome{TrainEnd::kCompleted, next};
        live[e] = false;
        --live_count;
      }
    }
    if (last || live_count == 0) break;
  }
  return finish(TrainEnd::kCompleted);
}

}  // namespace circuitlab::engine
