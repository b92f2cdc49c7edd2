// The reproduction job (ReproductionService's core): a recipe at a scale
// and a number of seeds, carried through training, analyses and checks.
//
// Life of a reproduction: Begin validates the recipe (recipes.h), the scale,
// the seeds and every member spec of every sweep (as SubmitRun would), and
// stores the reproduction TRAINING. A driver thread then advances every
// unfinished reproduction each tick, from its stored record alone: it
// submits the sweeps it has not submitted (each with a "seed" axis added;
// a full queue makes it wait, not fail), waits for their runs to end, asks
// for every analysis on every succeeded member (AnalysisCore: a stored
// answer comes back at once, a missing one is a job), reads the sweeps'
// summaries (labels are jobs too), and once nothing is pending evaluates the
// checks (report.h) and stores the report, DONE. Every step is recorded
// before the next is taken, so a restarted server resumes where it was:
// finished runs are not retrained, stored analyses not recomputed.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "circuitlab/v1/reproduce.pb.h"
#include "nlohmann/json.hpp"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"
#include "server/store/store.h"

namespace circuitlab::reproduce {

struct ReproductionOptions {
  std::chrono::milliseconds tick = std::chrono::seconds(1);
  int max_active = 64;           // unfinished reproductions, all owners
  int max_active_per_owner = 8;  // unfinished reproductions of one owner
};

absl::StatusOr<int64_t> ParseReproductionId(const std::string& text);
std::string FormatReproductionId(int64_t id);

class ReproductionCore {
 public:
  // All must outlive the core.
  ReproductionCore(store::Store* store, scheduler::Scheduler* runs, scheduler::SweepCore* sweeps,
                   scheduler::AnalysisCore* analyses, ReproductionOptions options = {});
  ~ReproductionCore();  // Shutdown()

  // Starts the driver (which resumes the unfinished reproductions).
  void Start();
  // Stops the driver; unfinished reproductions stay stored as they are.
  void Shutdown();
  // Advance now instead of at the next tick.
  void Wake();

  v1::ListRecipesResponse Recipes() const;
  absl::StatusOr<v1::Reproduction> Begin(const v1::StartReproductionRequest& request, const std::string& owner);
  absl::StatusOr<v1::Reproduction> Get(const std::string& id);
  // Newest first, a page of at most page_size and kMaxListBytes; only
  // `owner`'s when it is not empty. The BASIC view reads only the stored
  // summaries; FULL has the recipes and reports but their tables.
  absl::StatusOr<v1::ListReproductionsResponse> List(const v1::ListReproductionsRequest& request,
                                                     const std::string& owner);
  // Cancels the sweeps' runs that have not ended; FailedPrecondition for a
  // reproduction that has ended.
  absl::StatusOr<v1::Reproduction> Cancel(const std::string& id);
  absl::StatusOr<std::string> OwnerOf(const std::string& id);

 private:
  // Begin's admission: the reproduction's runs within the server's and the
  // owner's limits, every member as SubmitRun would take it (its total runs);
  // the unfinished reproductions of the owner and of the server under theirs.
  absl::StatusOr<int64_t> CheckRuns(const v1::RecipeScale& scale, const v1::Reproduction& r,
                                    const std::string& owner);
  absl::Status CheckActive(const std::string& owner);
  void Loop();
  void AdvanceAll();
  // One step of `r`; true when its record changed.
  bool Advance(v1::Reproduction* r);
  bool Train(v1::Reproduction* r);
  // r's owner's other reproductions whose sweeps r may reuse: the newest
  // kReuseWindow that did not fail and were not cancelled, without reports.
  std::vector<v1::Reproduction> ReuseCandidates(const v1::Reproduction& r);
  // The id of a sweep of one of `candidates` that trains `experiment`
  // (ExperimentOf), and none of whose runs failed or was cancelled.
  std::optional<std::string> Reusable(const v1::SweepSpec& experiment,
                                      const std::vector<v1::Reproduction>& candidates);
  static constexpr int kReuseWindow = 200;
  bool Analyse(v1::Reproduction* r);
  absl::Status Save(const v1::Reproduction& r);
  // A "series:<metric>" or "trajectory:<coordinate>" column of one run:
  // [[step, value], ...], or null when the run has none.
  nlohmann::json Series(const std::string& run_id, const std::string& column);

  store::Store* const store_;
  scheduler::Scheduler* const runs_;
  scheduler::SweepCore* const sweeps_;
  scheduler::AnalysisCore* const analyses_;
  const ReproductionOptions options_;

  std::mutex advance_mu_;  // one Advance or Cancel at a time (they rewrite the record)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false, woken_ = false;
  std::thread driver_;
};

}  // namespace circuitlab::reproduce
