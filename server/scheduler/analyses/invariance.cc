// CheckInvariance: Theorem 1 numerically (SCIENCE.md C.6, E.2) on a run's or
// a sent spec's task and model; validation, canonical request, the job.
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"

#include <vector>

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
constexpr int kMaxLadder = 12;
constexpr uint64_t kMinSamples = 16, kMaxSamples = 1 << 22;
const std::vector<uint64_t> kDefaultLadder = {256, 1024, 4096, 16384, 65536, 262144};

namespace {

absl::StatusOr<AnalysisPlan<v1::CheckInvarianceResponse>> PlanCheckInvariance(AnalysisCore& core, const v1::CheckInvarianceRequest& request) {
  if (request.has_spec() && !request.run_id().empty()) {
    return absl::InvalidArgumentError("give run_id or spec, not both");
  }
  if (!request.has_spec()) CL_RETURN_IF_ERROR(ParseRunId(request.run_id()).status());
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  if (request.sample_sizes_size() > kMaxLadder) {
    return absl::InvalidArgumentError("sample_sizes must have at most " + std::to_string(kMaxLadder) +
                                      " entries, got " + std::to_string(request.sample_sizes_size()));
  }
  for (int i = 0; i < request.sample_sizes_size(); ++i) {
    const uint64_t n = request.sample_sizes(i);
    if (n < kMinSamples || n > kMaxSamples) {
      return absl::InvalidArgumentError("sample_sizes[" + std::to_string(i) + "] must be in [" +
                                        std::to_string(kMinSamples) + ", " + std::to_string(kMaxSamples) +
                                        "], got " + std::to_string(n));
    }
    if (i > 0 && n <= request.sample_sizes(i - 1)) {
      return absl::InvalidArgumentError("sample_sizes must be strictly increasing, got " + std::to_string(n) +
                                        " after " + std::to_string(request.sample_sizes(i - 1)));
    }
  }
  if (!(request.coordinate_std() >= 0 && request.coordinate_std() <= 100)) {
    return absl::InvalidArgumentError("coordinate_std must be in (0, 100] (0 means 1), got " +
                                      std::to_string(request.coordinate_std()));
  }
  CL_ASSIGN_OR_RETURN(auto target, core.TargetSpec(request.run_id(), request.has_spec() ? &request.spec() : nullptr));
  const int64_t id = target.first;
  v1::ExperimentSpec spec = std::move(target.second);
  CL_RETURN_IF_ERROR(NeedsCoordinates(spec, "CheckInvariance"));
  v1::CheckInvarianceRequest canonical;  // defaults resolved, force dropped
  if (id == store::Store::kNoRun) {
    *canonical.mutable_spec() = spec;
  } else {
    canonical.set_run_id(FormatRunId(id));
  }
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_PAPER ? v1::BASIS_SELECTION_PAPER
                                                                           : v1::BASIS_SELECTION_COMPLETE);
  if (request.sample_sizes_size() == 0) {
    canonical.mutable_sample_sizes()->Add(kDefaultLadder.begin(), kDefaultLadder.end());
  } else {
    *canonical.mutable_sample_sizes() = request.sample_sizes();
  }
  canonical.set_coordinate_std(request.coordinate_std() == 0 ? 1.0 : request.coordinate_std());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  canonical.set_controls(request.controls());
  canonical.set_sgd_corollary(request.sgd_corollary());
  const uint64_t memory = JobMemory(spec, 0);
  return EnginePlan<v1::CheckInvarianceResponse>(core.analyzer(), id, canonical, {std::move(spec), {}, {}}, memory);
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("invariance", v1::CheckInvarianceRequest, v1::CheckInvarianceResponse, PlanCheckInvariance);

}  // namespace circuitlab::scheduler
