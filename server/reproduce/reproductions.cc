#include "server/reproduce/reproductions.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/reproduce/recipes.h"
#include "server/reproduce/report.h"
#include "server/reproduce/reproduction_records.h"

namespace circuitlab::reproduce {
namespace {

constexpr uint32_t kMaxSeeds = 16;
constexpr int64_t kMaxTotalRuns = 4096;  // every member of every sweep, all seeds
// A list page ends before the reproduction that would take it over this
// many stored bytes (summaries, or with the FULL view whole records).
constexpr int64_t kMaxListBytes = 1 << 20;

}  // namespace

absl::StatusOr<int64_t> ParseReproductionId(const std::string& text) {
  // One spelling per id (issue 51 item 9): "p" and a number without sign,
  // space or leading zero, nothing after it.
  const bool canonical =
      text.size() >= 2 && text.size() <= 19 && text[0] == 'p' && text[1] != '0' &&
      std::all_of(text.begin() + 1, text.end(), [](unsigned char c) { return c >= '0' && c <= '9'; });
  if (!canonical) {
    return absl::InvalidArgumentError(
        "reproduction_id must look like \"p3\" (p and a number, no sign, space or "
        "leading zero), got " +
        Quote(text));
  }
  return std::stoll(text.substr(1));
}

std::string FormatReproductionId(int64_t id) { return "p" + std::to_string(id); }

ReproductionCore::ReproductionCore(store::Store* store, scheduler::Scheduler* runs, scheduler::SweepCore* sweeps,
                                   scheduler::AnalysisCore* analyses, ReproductionOptions options)
    : store_(store), runs_(runs), sweeps_(sweeps), analyses_(analyses), options_(options) {}

ReproductionCore::~ReproductionCore() { Shutdown(); }

void ReproductionCore::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (driver_.joinable() || stopping_) return;
  driver_ = std::thread([this] { Loop(); });
}

void ReproductionCore::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (driver_.joinable()) driver_.join();
}

void ReproductionCore::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void ReproductionCore::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    AdvanceAll();
    lock.lock();
    cv_.wait_for(lock, options_.tick, [this] { return stopping_ || woken_; });
    woken_ = false;
  }
}

void ReproductionCore::AdvanceAll() {
  absl::StatusOr<store::ReproductionPage> page =
      store_->ListReproductions(Summaries("", Unfinished(), options_.max_active + 1));
  if (!page.ok()) {
    spdlog::warn("reproductions: cannot list the unfinished ones: {}", std::string(page.status().message()));
    return;
  }
  std::reverse(page->rows.begin(), page->rows.end());  // oldest first
  for (const store::ReproductionRow& row : page->rows) {
    std::lock_guard<std::mutex> lock(advance_mu_);
    v1::Reproduction r;
    absl::StatusOr<store::ReproductionRow> fresh = store_->GetReproduction(row.id);  // Cancel may have ended it
    if (!fresh.ok() || !r.ParseFromString(fresh->body) || Ended(r.state())) continue;
    if (Advance(&r)) {
      if (absl::Status s = Save(r); !s.ok())
        spdlog::warn("{}: not saved: {}", r.reproduction_id(), std::string(s.message()));
    }
  }
}

absl::Status ReproductionCore::Save(const v1::Reproduction& r) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseReproductionId(r.reproduction_id()));
  return store_->UpdateReproduction(id, r.state(), r.SerializeAsString(), Summary(r).SerializeAsString());
}

bool ReproductionCore::Advance(v1::Reproduction* r) {
  if (!r->recipe().scales().contains(r->scale())) {
    r->set_state(v1::REPRODUCTION_STATE_FAILED);
    r->set_error("the stored recipe has no scale " + r->scale());
    return true;
  }
  if (r->state() == v1::REPRODUCTION_STATE_TRAINING) return Train(r);
  return Analyse(r);
}

v1::ListRecipesResponse ReproductionCore::Recipes() const {
  v1::ListRecipesResponse out;
  for (const v1::Recipe& r : BuiltInRecipes()) {
    v1::ListRecipesResponse::Entry* e = out.add_recipes();
    e->set_id(r.id());
    e->set_title(r.title());
    e->set_claim(r.claim());
    std::vector<std::string> names;
    for (const auto& [name, scale] : r.scales()) {
      names.push_back(name);
      (*e->mutable_estimated_cpu_hours())[name] = scale.estimated_cpu_hours();
    }
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) e->add_scales(n);
  }
  return out;
}

absl::StatusOr<int64_t> ReproductionCore::CheckRuns(const v1::RecipeScale& scale, const v1::Reproduction& r,
                                                     const std::string& owner) {
  // The sizes first, from the sweeps' shapes (axes x values x seeds), before
  // anything is expanded: an oversized recipe costs nothing to refuse.
  const int max_runs = sweeps_->MaxRunsFor(owner);
  const int queue = runs_->QueueLimitFor(owner);
  int64_t total = 0;
  bool capped = false;
  const v1::RecipeSweep* too_wide = nullptr;
  int64_t too_wide_members = 0;
  for (const v1::RecipeSweep& s : scale.sweeps()) {
    const int64_t members = scheduler::SweepMemberCount(s.sweep(), kMaxTotalRuns);
    capped = capped || members > kMaxTotalRuns;
    total += members * r.seeds();
    if (members > queue && too_wide == nullptr) {
      too_wide = &s;
      too_wide_members = members;
    }
  }
  if (total > kMaxTotalRuns) {
    return absl::ResourceExhaustedError("the reproduction has " + std::string(capped ? "more than " : "") +
                                        std::to_string(total) + " runs; at most " + std::to_string(kMaxTotalRuns) +
                                        " (lower seeds)");
  }
  if (too_wide != nullptr) {
    return absl::ResourceExhaustedError("sweep " + too_wide->name() + " has " + std::to_string(too_wide_members) +
                                        " runs per seed, more than " + owner + " may queue (" + std::to_string(queue) +
                                        ", --max-queued-per-client)");
  }
  // Then every member of every sweep is checked, as SubmitRun would check it.
  for (const v1::RecipeSweep& s : scale.sweeps()) {
    absl::StatusOr<std::vector<scheduler::SweepMember>> members =
        scheduler::ExpandSweep(SeededSweep(s, r, 0), max_runs);
    if (!members.ok()) {
      return absl::Status(members.status().code(),
                          "sweep " + s.name() + ": " + std::string(members.status().message()));
    }
    for (scheduler::SweepMember& m : *members) {
      const std::string who = m.spec.name();
      absl::StatusOr<store::NewRun> ok = runs_->PrepareRun(std::move(m.spec), owner);
      if (!ok.ok()) {
        return absl::Status(ok.status().code(),
                            "sweep " + s.name() + " member " + who + ": " + std::string(ok.status().message()));
      }
    }
  }
  return total;
}

absl::Status ReproductionCore::CheckActive(const std::string& owner) {
  CL_ASSIGN_OR_RETURN(auto mine,
                      store_->ListReproductions(Summaries(owner, Unfinished(), options_.max_active_per_owner)));
  if (static_cast<int>(mine.rows.size()) >= options_.max_active_per_owner) {
    return absl::ResourceExhaustedError(owner + " has " + std::to_string(mine.rows.size()) +
                                        " unfinished reproductions (at most " +
                                        std::to_string(options_.max_active_per_owner) + "); wait or cancel one");
  }
  CL_ASSIGN_OR_RETURN(auto all, store_->ListReproductions(Summaries("", Unfinished(), options_.max_active)));
  if (static_cast<int>(all.rows.size()) >= options_.max_active) {
    return absl::ResourceExhaustedError("the server has " + std::to_string(all.rows.size()) +
                                        " unfinished reproductions (at most " + std::to_string(options_.max_active) +
                                        ")");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Reproduction> ReproductionCore::Begin(const v1::StartReproductionRequest& request,
                                                         const std::string& owner) {
  v1::Recipe recipe;
  if (!request.recipe_id().empty()) {
    if (request.has_recipe()) return absl::InvalidArgumentError("set recipe_id or recipe, not both");
    CL_ASSIGN_OR_RETURN(recipe, FindRecipe(request.recipe_id()));
  } else if (request.has_recipe()) {
    recipe = request.recipe();
    CL_RETURN_IF_ERROR(ValidateRecipe(recipe));
  } else {
    return absl::InvalidArgumentError("recipe_id (e.g. \"E.9\") or recipe must be set");
  }
  if (!recipe.scales().contains(request.scale())) {
    return absl::InvalidArgumentError("scale must be one of " + ScaleNames(recipe) + " for recipe " + recipe.id() +
                                      ", got \"" + request.scale() + "\"");
  }
  const v1::RecipeScale scale = recipe.scales().at(request.scale());
  const uint32_t seeds = request.seeds() != 0 ? request.seeds() : std::max(1u, scale.default_seeds());
  if (seeds > kMaxSeeds) {
    return absl::InvalidArgumentError("seeds must be in [1, " + std::to_string(kMaxSeeds) + "], got " +
                                      std::to_string(seeds));
  }
  for (const v1::RecipeCheck& c : scale.checks()) {
    if (c.aggregate() == v1::RecipeCheck::AGGREGATE_AT_LEAST && c.at_least() > seeds) {
      return absl::InvalidArgumentError("seeds must be at least " + std::to_string(c.at_least()) + " for check " +
                                        c.id() + " of recipe " + recipe.id() + " (it holds when " +
                                        std::to_string(c.at_least()) + " seeds pass), got " + std::to_string(seeds));
    }
  }
  if (const int64_t least = MinReportBytes(scale, static_cast<int>(seeds)); least > kMaxReportBytes) {
    return absl::ResourceExhaustedError("recipe " + recipe.id() + " scale " + request.scale() +
                                        ": its report would hold at least " + std::to_string(least) +
                                        " bytes (the checks' texts, and their constants once per seed), more than a "
                                        "report may (" +
                                        std::to_string(kMaxReportBytes) + "); shorten the constants or lower seeds");
  }
  recipe.mutable_scales()->clear();
  (*recipe.mutable_scales())[request.scale()] = scale;
  v1::Reproduction r;
  r.set_reproduction_id("p0");
  r.set_recipe_id(recipe.id());
  r.set_title(recipe.title());
  r.set_scale(request.scale());
  r.set_seeds(seeds);
  r.set_owner(owner);
  *r.mutable_recipe() = recipe;
  CL_ASSIGN_OR_RETURN(const int64_t total, CheckRuns(scale, r, owner));
  CL_RETURN_IF_ERROR(CheckActive(owner));
  const int64_t now = NowUs();
  SetTime(now, r.mutable_created_at());
  r.set_state(v1::REPRODUCTION_STATE_TRAINING);
  r.set_phase("queued");
  store::ReproductionRow row{0, owner, r.state(), now, r.SerializeAsString(), Summary(r).SerializeAsString()};
  CL_ASSIGN_OR_RETURN(int64_t id, store_->InsertReproduction(row));
  r.set_reproduction_id(FormatReproductionId(id));
  CL_RETURN_IF_ERROR(Save(r));
  spdlog::info("{}: {} at scale {} with {} seed(s), {} runs, for {}", r.reproduction_id(), r.recipe_id(), r.scale(),
               seeds, total, owner);
  Wake();
  return r;
}

absl::StatusOr<v1::Reproduction> ReproductionCore::Get(const std::string& id) {
  CL_ASSIGN_OR_RETURN(int64_t n, ParseReproductionId(id));
  CL_ASSIGN_OR_RETURN(store::ReproductionRow row, store_->GetReproduction(n));
  v1::Reproduction r;
  if (!r.ParseFromString(row.body)) return absl::DataLossError("stored reproduction " + id + " does not parse");
  return r;
}

absl::StatusOr<v1::ListReproductionsResponse> ReproductionCore::List(const v1::ListReproductionsRequest& request,
                                                                     const std::string& owner) {
  if (request.page_size() < 0 || request.page_size() > 200) {
    return absl::InvalidArgumentError("page_size must be in [0, 200], got " + std::to_string(request.page_size()));
  }
  if (!v1::ReproductionView_IsValid(request.view())) {
    return absl::InvalidArgumentError("view must be REPRODUCTION_VIEW_BASIC or REPRODUCTION_VIEW_FULL, got " +
                                      std::to_string(request.view()));
  }
  const bool full = request.view() == v1::REPRODUCTION_VIEW_FULL;
  store::ReproductionQuery q = Summaries(owner, {}, request.page_size() ? request.page_size() : 50);
  q.with_body = full;
  q.max_bytes = kMaxListBytes;
  if (!request.page_token().empty()) {
    absl::StatusOr<int64_t> before = ParseReproductionId(request.page_token());
    if (!before.ok()) {
      return absl::InvalidArgumentError("page_token must be a previous answer's next_page_token, got \"" +
                                        request.page_token() + "\"");
    }
    q.before_id = *before;
  }
  // One more than the page, to know whether another follows.
  ++q.limit;
  CL_ASSIGN_OR_RETURN(store::ReproductionPage page, store_->ListReproductions(q));
  bool more = page.cut;
  if (static_cast<int>(page.rows.size()) == q.limit) {
    page.rows.pop_back();
    more = true;
  }
  v1::ListReproductionsResponse out;
  for (const store::ReproductionRow& row : page.rows) {
    v1::Reproduction r;
    if (!r.ParseFromString(full ? row.body : row.summary)) {
      return absl::DataLossError("stored reproduction p" + std::to_string(row.id) + " does not parse");
    }
    if (full) {
      r.mutable_report()->clear_tables();
    } else if (r.has_recipe()) {
      r = Summary(r);  // stored before summaries were
    }
    *out.add_reproductions() = std::move(r);
  }
  if (more && !page.rows.empty()) out.set_next_page_token(FormatReproductionId(page.rows.back().id));
  return out;
}

absl::StatusOr<v1::Reproduction> ReproductionCore::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(advance_mu_);
  CL_ASSIGN_OR_RETURN(v1::Reproduction r, Get(id));
  if (Ended(r.state())) {
    return absl::FailedPreconditionError(id + " has already ended (" + v1::ReproductionState_Name(r.state()) + ")");
  }
  // Sweeps another unfinished reproduction of the owner shares stay.
  std::set<std::string> shared;
  absl::StatusOr<store::ReproductionPage> others =
      store_->ListReproductions(Summaries(r.owner(), Unfinished(), kReuseWindow));
  for (const store::ReproductionRow& row : others.ok() ? others->rows : std::vector<store::ReproductionRow>()) {
    v1::Reproduction other;
    if (!other.ParseFromString(row.summary) || other.reproduction_id() == r.reproduction_id()) continue;
    for (const auto& [name, sweep] : other.sweeps()) shared.insert(sweep);
  }
  std::set<std::string> runs;  // of the sweeps cancelled
  for (const auto& [name, sweep] : r.sweeps()) {
    if (shared.contains(sweep)) continue;
    absl::StatusOr<v1::Sweep> s = sweeps_->Cancel(sweep);
    if (!s.ok() && !absl::IsNotFound(s.status()))
      spdlog::warn("{}: cancel {}: {}", id, sweep, std::string(s.status().message()));
    if (s.ok()) runs.insert(s->run_ids().begin(), s->run_ids().end());
  }
  // And the analysis jobs it started on their runs, queued or running.
  const v1::ListAnalysisJobsResponse jobs = analyses_->jobs().List(
      [&](const v1::AnalysisJob& j) { return j.owner() == r.owner() && runs.contains(j.run_id()); });
  for (const v1::AnalysisJob& j : jobs.jobs()) (void)analyses_->jobs().Cancel(j.job_id());
  r.set_state(v1::REPRODUCTION_STATE_CANCELLED);
  r.set_phase("cancelled");
  SetTime(NowUs(), r.mutable_finished_at());
  CL_RETURN_IF_ERROR(Save(r));
  return r;
}

absl::StatusOr<std::string> ReproductionCore::OwnerOf(const std::string& id) {
  CL_ASSIGN_OR_RETURN(int64_t n, ParseReproductionId(id));
  CL_ASSIGN_OR_RETURN(store::ReproductionRow row, store_->GetReproduction(n));
  return row.owner;
}

}  // namespace circuitlab::reproduce
