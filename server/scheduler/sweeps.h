// Sweeps: a base spec and axes expanded into member runs grouped under a
// sweep id, their summary table (one row per member: swept values and chosen
// summary values), filters and a 2-D pivot.
//
// Expansion edits the base spec through protobuf's JSON mapping: the spec is
// printed as JSON (proto field names), each axis sets its field (a dotted path
// or a JSON pointer) to the member's value, and the result is parsed back by
// protobuf, so every field a spec file can hold can be swept, and a value of
// the wrong type is protobuf's own error naming the field.
//
// Thread-safety: SweepCore's methods are thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "circuitlab/v1/experiment_service.pb.h"
#include "google/protobuf/struct.pb.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/store/store.h"

namespace circuitlab::scheduler {

struct SweepMember {
  v1::ExperimentSpec spec;                      // not yet resolved
  std::vector<google::protobuf::Value> values;  // per axis
};

// The members of a sweep in expansion order (grid axes vary fastest last;
// random draws outermost). InvalidArgument naming the axis for a bad axis or
// a value that does not fit its field; ResourceExhausted beyond max_members.
absl::StatusOr<std::vector<SweepMember>> ExpandSweep(const v1::SweepSpec& sweep, int max_members);

// How many members the sweep expands to (draws of the random axes times the
// grid axes' sizes), counted without expanding; stops counting past `cap`.
int64_t SweepMemberCount(const v1::SweepSpec& sweep, int64_t cap);

// Axis names (SweepAxis.name or the field's last component), in axis order.
std::vector<std::string> AxisNames(const v1::SweepSpec& sweep);

class SweepCore {
 public:
  // All must outlive the core; `analyses` may be null (then the "circuit"
  // columns stay pending).
  // `quotas` (may be null) overrides max_sweep_runs per principal.
  SweepCore(Scheduler* scheduler, store::Store* store, AnalysisCore* analyses, int max_sweep_runs = 1024,
            const Quotas* quotas = nullptr);

  absl::StatusOr<v1::Sweep> Submit(const v1::SweepSpec& sweep, const std::string& owner);
  absl::StatusOr<v1::Sweep> Get(const std::string& sweep_id);
  absl::StatusOr<v1::Sweep> Cancel(const std::string& sweep_id);
  // The most runs one sweep of `owner` may expand to.
  int MaxRunsFor(const std::string& owner) const {
    return LimitFor(quotas_ ? quotas_->For(owner).max_sweep_runs : 0, max_sweep_runs_);
  }
  // The principal that submitted a sweep (NotFound for an unknown one).
  absl::StatusOr<std::string> OwnerOf(const std::string& sweep_id);
  // Deletes the sweep and its member runs; refused while a member has not
  // ended (Scheduler::DeleteRuns).
  absl::StatusOr<v1::DeleteSweepResponse> Delete(const std::string& sweep_id);
  // The summary table. Label columns (circuit, pair, pair_predicted) ask
  // LabelRun for each finished member as `who`: a reader's summary shows
  // stored labels only (a cell not labelled yet says so), others start the
  // missing jobs (issue 32 item 2). `started` (may be null) receives how many
  // members' labels were not stored yet (pending or just queued).
  absl::StatusOr<v1::GetSweepSummaryResponse> Summary(const v1::GetSweepSummaryRequest& request,
                                                      const Requester& who = {}, int* started = nullptr);

 private:
  absl::StatusOr<v1::Sweep> ToSweep(const store::SweepRow& row, const std::vector<store::RunRow>& runs);

  Scheduler* const scheduler_;
  store::Store* const store_;
  AnalysisCore* const analyses_;
  const int max_sweep_runs_;
  const Quotas* const quotas_;
};

}  // namespace circuitlab::scheduler
