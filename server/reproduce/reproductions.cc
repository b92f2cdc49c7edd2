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

#include "server/common/text.h"
#include "server/common/status_macros.h"
#include "server/reproduce/recipes.h"
#include "server/reproduce/report.h"

namespace circuitlab::reproduce {
namespace {

using Json = nlohmann::json;

constexpr uint32_t kMaxSeeds = 16;
constexpr int64_t kMaxTotalRuns = 4096;  // every member of every sweep, all seeds
// A list page ends before the reproduction that would take it over this
// many stored bytes (summaries, or with the FULL view whole records).
constexpr int64_t kMaxListBytes = 1 << 20;
// What reuse reads of the owner's earlier reproductions' records at most.
constexpr int64_t kMaxReuseBytes = 64 << 20;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SetTime(int64_t us, google::protobuf::Timestamp* t) {
  t->set_seconds(us / 1000000);
  t->set_nanos(static_cast<int32_t>(us % 1000000) * 1000);
}

int64_t MicrosOf(const google::protobuf::Timestamp& t) { return t.seconds() * 1000000 + t.nanos() / 1000; }

bool Ended(v1::ReproductionState s) {
  return s == v1::REPRODUCTION_STATE_DONE || s == v1::REPRODUCTION_STATE_FAILED ||
         s == v1::REPRODUCTION_STATE_CANCELLED;
}

const v1::RecipeScale& ScaleOf(const v1::Reproduction& r) { return r.recipe().scales().at(r.scale()); }

// The record in the BASIC view: no recipe and, of the report, its counts.
v1::Reproduction Summary(const v1::Reproduction& r) {
  v1::Reproduction out = r;
  out.clear_recipe();
  out.clear_report();
  if (r.has_report()) {
    v1::ReproductionReport* rep = out.mutable_report();
    rep->set_passed(r.report().passed());
    rep->set_failed(r.report().failed());
    rep->set_inconclusive(r.report().inconclusive());
    rep->set_wall_seconds(r.report().wall_seconds());
  }
  return out;
}

std::vector<int> Unfinished() { return {v1::REPRODUCTION_STATE_TRAINING, v1::REPRODUCTION_STATE_ANALYSING}; }

// The summaries of `owner`'s (everyone's when empty) newest `limit` in `states`.
store::ReproductionQuery Summaries(std::string owner, std::vector<int> states, int limit) {
  store::ReproductionQuery q;
  q.owner = std::move(owner);
  q.states = std::move(states);
  q.limit = limit;
  return q;
}

// The sweep of seed `k` (0-based) as the reproduction submits it: named
// after the reproduction, tagged with its id, with a one-value seed axis
// added last (one sweep per seed keeps each within a client's queue).
v1::SweepSpec SeededSweep(const v1::RecipeSweep& s, const v1::Reproduction& r, uint32_t k) {
  v1::SweepSpec out = s.sweep();
  out.set_name(r.recipe_id() + " " + r.scale() + " " + s.name() + " seed " + std::to_string(k + 1) + " (" +
               r.reproduction_id() + ")");
  if (out.base().name().empty()) out.mutable_base()->set_name(r.recipe_id() + "-" + s.name());
  out.mutable_base()->add_tags("reproduction:" + r.reproduction_id());
  v1::SweepAxis* seed = out.add_axes();
  seed->set_field(kSeedAxis);
  seed->set_name(kSeedAxis);
  seed->add_values()->set_number_value(static_cast<double>(out.base().seed() + k));
  return out;
}

// The key of seed k's sweep in Reproduction.sweeps: "plane/1".
std::string SweepKey(const v1::RecipeSweep& s, uint32_t k) { return s.name() + "/" + std::to_string(k + 1); }

// What seed k's sweep trains, without the names and tags that only say who
// asked: two reproductions whose experiments are equal train the same runs.
v1::SweepSpec ExperimentOf(const v1::RecipeSweep& s, const v1::Reproduction& r, uint32_t k) {
  v1::SweepSpec out = SeededSweep(s, r, k);
  out.clear_name();
  out.mutable_base()->clear_name();
  out.mutable_base()->clear_tags();
  for (const std::string& tag : s.sweep().base().tags()) out.mutable_base()->add_tags(tag);
  return out;
}

// The columns of each sweep the checks read, by kind.
struct Needed {
  std::set<std::string> summary, series;
  std::map<std::string, std::set<std::string>> analysis_paths;  // analysis name -> field paths
};

std::map<std::string, Needed> NeededColumns(const v1::RecipeScale& scale) {
  std::map<std::string, Needed> out;
  for (const v1::RecipeSweep& s : scale.sweeps()) out[s.name()];
  auto add = [&](const v1::RecipeValue& v) {
    if (!v.has_column()) return;
    const v1::ColumnValue& c = v.column();
    Needed& n = out[c.sweep()];
    for (const std::string* named : {&c.column(), &c.other()}) {
      const std::string& column = *named;
      if (column.empty()) continue;
      const v1::RecipeAnalysis* a = nullptr;
      if (IsSeriesColumn(column)) {
        n.series.insert(column);
      } else if (IsAnalysisColumn(scale, column, &a)) {
        n.analysis_paths[a->name()].insert(column.substr(a->name().size() + 1));
      } else if (named == &c.other() && c.reduce() == v1::ColumnValue::REDUCE_SLOPE_LOGLOG) {
        continue;  // an axis name, or a column named below
      } else {
        n.summary.insert(column);
      }
    }
  };
  for (const v1::RecipeCheck& c : scale.checks()) {
    add(c.value());
    add(c.against());
  }
  // The figures' columns (CURVE's x may be a column too; an axis name is
  // not one, and the table leaves out a column it cannot find).
  const auto axis = [&](const std::string& sweep, const std::string& name) {
    for (const v1::RecipeSweep& s : scale.sweeps()) {
      if (s.name() != sweep) continue;
      if (name == kSeedAxis) return true;
      for (const v1::SweepAxis& a : s.sweep().axes()) {
        const std::string& field = a.field();
        const std::string last = field.substr(field.find_last_of("./") == std::string::npos
                                                  ? 0
                                                  : field.find_last_of("./") + 1);
        if ((a.name().empty() ? last : a.name()) == name) return true;
      }
    }
    return false;
  };
  for (const v1::RecipeFigure& f : scale.figures()) {
    std::vector<std::string> columns(f.columns().begin(), f.columns().end());
    if (f.kind() == v1::RecipeFigure::KIND_CURVE && !axis(f.sweep(), f.x())) columns.push_back(f.x());
    for (const std::string& column : columns) {
      v1::RecipeValue v;
      v.mutable_column()->set_sweep(f.sweep());
      v.mutable_column()->set_column(column);
      add(v);
    }
  }
  return out;
}

// The analysis request of `a` for one run (its run_id field set).
std::unique_ptr<google::protobuf::Message> RequestFor(const v1::RecipeAnalysis& a, const std::string& run_id) {
  const google::protobuf::Reflection* refl = a.GetReflection();
  const google::protobuf::FieldDescriptor* f = a.GetDescriptor()->FindFieldByNumber(a.request_case());
  std::unique_ptr<google::protobuf::Message> m(refl->GetMessage(a, f).New());
  m->CopyFrom(refl->GetMessage(a, f));
  const google::protobuf::FieldDescriptor* id = m->GetDescriptor()->FindFieldByName("run_id");
  if (id != nullptr) m->GetReflection()->SetString(m.get(), id, run_id);
  return m;
}

}  // namespace

absl::StatusOr<int64_t> ParseReproductionId(const std::string& text) {
  // One spelling per id (issue 51 item 9): "p" and a number without sign,
  // space or leading zero, nothing after it.
  const bool canonical = text.size() >= 2 && text.size() <= 19 && text[0] == 'p' && text[1] != '0' &&
                         std::all_of(text.begin() + 1, text.end(), [](unsigned char c) { return c >= '0' && c <= '9'; });
  if (!canonical) {
    return absl::InvalidArgumentError("reproduction_id must look like \"p3\" (p and a number, no sign, space or "
                                      "leading zero), got " + Quote(text));
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

std::vector<v1::Reproduction> ReproductionCore::ReuseCandidates(const v1::Reproduction& r) {
  std::vector<v1::Reproduction> out;
  store::ReproductionQuery q = Summaries(
      r.owner(), {v1::REPRODUCTION_STATE_TRAINING, v1::REPRODUCTION_STATE_ANALYSING, v1::REPRODUCTION_STATE_DONE},
      kReuseWindow);
  q.with_body = true;
  q.max_bytes = kMaxReuseBytes;
  absl::StatusOr<store::ReproductionPage> page = store_->ListReproductions(q);
  if (!page.ok()) return out;
  for (const store::ReproductionRow& row : page->rows) {
    v1::Reproduction other;
    if (!other.ParseFromString(row.body) || other.reproduction_id() == r.reproduction_id() ||
        !other.recipe().scales().contains(other.scale()))
      continue;
    other.clear_report();  // only the recipe and the sweeps are read
    out.push_back(std::move(other));
  }
  return out;
}

std::optional<std::string> ReproductionCore::Reusable(const v1::SweepSpec& experiment,
                                                      const std::vector<v1::Reproduction>& candidates) {
  for (const v1::Reproduction& other : candidates) {
    for (const v1::RecipeSweep& s : ScaleOf(other).sweeps()) {
      for (uint32_t k = 0; k < other.seeds(); ++k) {
        auto id = other.sweeps().find(SweepKey(s, k));
        if (id == other.sweeps().end() ||
            !google::protobuf::util::MessageDifferencer::Equals(ExperimentOf(s, other, k), experiment))
          continue;
        // Only a sweep whose runs are still there and none of which failed
        // or was cancelled.
        absl::StatusOr<v1::Sweep> sweep = sweeps_->Get(id->second);
        if (!sweep.ok()) continue;
        bool sound = true;
        for (const auto& [state, count] : sweep->states()) {
          if (count > 0 &&
              (state == v1::RunState_Name(v1::RUN_STATE_FAILED) || state == v1::RunState_Name(v1::RUN_STATE_CANCELLED)))
            sound = false;
        }
        if (sound) return id->second;
      }
    }
  }
  return std::nullopt;
}

bool ReproductionCore::Train(v1::Reproduction* r) {
  const v1::RecipeScale& scale = ScaleOf(*r);
  bool changed = false;
  std::optional<std::vector<v1::Reproduction>> candidates;  // read once per call, when a sweep is still to submit
  for (const v1::RecipeSweep& s : scale.sweeps()) {
    for (uint32_t k = 0; k < r->seeds(); ++k) {
      if (r->sweeps().contains(SweepKey(s, k))) continue;
      // The same experiment, trained or training for another of the owner's
      // reproductions: its runs (and the analyses stored on them) are used.
      if (!candidates) candidates = ReuseCandidates(*r);
      if (std::optional<std::string> same = Reusable(ExperimentOf(s, *r, k), *candidates)) {
        (*r->mutable_sweeps())[SweepKey(s, k)] = *same;
        changed = true;
        continue;
      }
      absl::StatusOr<v1::Sweep> sweep = sweeps_->Submit(SeededSweep(s, *r, k), r->owner());
      if (absl::IsResourceExhausted(sweep.status()) || absl::IsUnavailable(sweep.status())) {
        const std::string phase =
            "waiting for room to queue " + s.name() + ": " + std::string(sweep.status().message());
        changed = changed || phase != r->phase();
        r->set_phase(phase);
        return changed;
      }
      if (!sweep.ok()) {
        r->set_state(v1::REPRODUCTION_STATE_FAILED);
        r->set_error("sweep " + s.name() + ": " + std::string(sweep.status().message()));
        SetTime(NowUs(), r->mutable_finished_at());
        return true;
      }
      (*r->mutable_sweeps())[SweepKey(s, k)] = sweep->sweep_id();
      // Recorded before the next sweep is submitted: a restart does not
      // submit this one again.
      if (absl::Status saved = Save(*r); !saved.ok())
        spdlog::warn("{}: {}", r->reproduction_id(), std::string(saved.message()));
      changed = true;
    }
  }
  int64_t total = 0, ended = 0;
  for (const auto& [name, id] : r->sweeps()) {
    absl::StatusOr<v1::Sweep> sweep = sweeps_->Get(id);
    if (!sweep.ok()) {
      r->set_state(v1::REPRODUCTION_STATE_FAILED);
      r->set_error("sweep " + name + " (" + id + "): " + std::string(sweep.status().message()));
      SetTime(NowUs(), r->mutable_finished_at());
      return true;
    }
    for (const auto& [state, count] : sweep->states()) {
      total += count;
      v1::RunState rs;
      if (v1::RunState_Parse(state, &rs) && scheduler::IsFinal(rs)) ended += count;
    }
  }
  const double progress = total == 0 ? 0 : 0.8 * static_cast<double>(ended) / static_cast<double>(total);
  const std::string phase = "training: " + std::to_string(ended) + " of " + std::to_string(total) + " runs ended";
  changed = changed || phase != r->phase();
  r->set_phase(phase);
  r->set_progress(progress);
  if (total > 0 && ended == total) {
    r->set_state(v1::REPRODUCTION_STATE_ANALYSING);
    r->set_phase("analysing");
    changed = true;
  }
  return changed;
}

Json ReproductionCore::Series(const std::string& run_id, const std::string& column) {
  std::vector<std::pair<uint64_t, double>> points;
  if (column.rfind("series:", 0) == 0) {
    v1::GetMetricsRequest q;
    q.set_run_id(run_id);
    q.add_names(column.substr(7));
    absl::StatusOr<v1::GetMetricsResponse> m = runs_->GetMetrics(q);
    if (!m.ok() || m->series_size() != 1) return nullptr;
    for (int i = 0; i < m->series(0).steps_size(); ++i)
      points.emplace_back(m->series(0).steps(i), m->series(0).values(i));
  } else {
    v1::GetTrajectoryRequest q;
    q.set_run_id(run_id);
    q.add_names(column.substr(11));  // after "trajectory:"
    absl::StatusOr<v1::GetTrajectoryResponse> t = analyses_->GetTrajectory(q);
    if (!t.ok() || t->series_size() != 1) return nullptr;
    for (int i = 0; i < t->series(0).steps_size(); ++i)
      points.emplace_back(t->series(0).steps(i), t->series(0).values(i));
  }
  Json out = Json::array();
  for (const auto& [step, value] : points) out.push_back(Json::array({static_cast<double>(step), value}));
  return out;
}

bool ReproductionCore::Analyse(v1::Reproduction* r) {
  const v1::RecipeScale& scale = ScaleOf(*r);
  const std::map<std::string, Needed> needed = NeededColumns(scale);
  Tables tables;
  std::vector<std::string> notes;
  int pending = 0, asked = 0;
  for (const v1::RecipeSweep& s : scale.sweeps()) {
    const Needed& n = needed.at(s.name());
    // The seeds' sweeps in one table.
    absl::StatusOr<v1::GetSweepSummaryResponse> summary;
    for (uint32_t k = 0; k < r->seeds(); ++k) {
      v1::GetSweepSummaryRequest req;
      req.set_sweep_id(r->sweeps().at(SweepKey(s, k)));
      for (const std::string& c : n.summary) req.add_values(c);
      if (req.values().empty()) req.add_values("train/loss");
      absl::StatusOr<v1::GetSweepSummaryResponse> one = sweeps_->Summary(req, scheduler::Requester(r->owner()));
      if (!one.ok()) {
        r->set_state(v1::REPRODUCTION_STATE_FAILED);
        r->set_error("summary of " + SweepKey(s, k) + ": " + std::string(one.status().message()));
        SetTime(NowUs(), r->mutable_finished_at());
        return true;
      }
      if (k == 0) {
        summary = std::move(one);
        continue;
      }
      summary->set_sweep_id(summary->sweep_id() + "," + one->sweep_id());
      summary->set_pending(summary->pending() + one->pending());
      for (v1::SweepRow& row : *one->mutable_rows()) *summary->add_rows() = std::move(row);
    }
    pending += static_cast<int>(summary->pending());
    asked += summary->rows_size() * static_cast<int>(n.summary.size());
    // Analysis fields and series, appended as columns.
    std::vector<std::pair<const v1::RecipeAnalysis*, std::string>> extra;
    for (const v1::RecipeAnalysis& a : scale.analyses()) {
      if (a.sweep() != s.name()) continue;
      auto paths = n.analysis_paths.find(a.name());
      if (paths == n.analysis_paths.end()) continue;
      for (const std::string& p : paths->second) extra.emplace_back(&a, p);
    }
    for (const std::string& c : n.series) extra.emplace_back(nullptr, c);
    for (const auto& [a, p] : extra) summary->add_columns(a ? a->name() + "." + p : p);
    for (v1::SweepRow& row : *summary->mutable_rows()) {
      const bool succeeded = row.state() == v1::RUN_STATE_SUCCEEDED;
      if (!succeeded) {
        absl::StatusOr<v1::Run> run = runs_->GetRun(row.run_id());
        notes.push_back("run " + row.run_id() + " of " + s.name() + " ended " +
                        v1::RunState_Name(row.state()).substr(10) +
                        (run.ok() && !run->error().empty() ? ": " + run->error() : ""));
      }
      std::map<const v1::RecipeAnalysis*, Json> answers;
      for (const auto& [a, p] : extra) {
        Json cell;
        if (succeeded && a != nullptr) {
          if (!answers.contains(a)) {
            ++asked;
            absl::StatusOr<std::unique_ptr<google::protobuf::Message>> got =
                analyses_->Run(*RequestFor(*a, row.run_id()), scheduler::Requester(r->owner()));
            Json doc;
            if (!got.ok()) {
              notes.push_back("analysis " + a->name() + " on " + row.run_id() + ": " +
                              std::string(got.status().message()));
            } else if (scheduler::IsPendingResponse(**got)) {
              ++pending;
            } else {
              std::string text;
              google::protobuf::util::JsonPrintOptions o;
              o.preserve_proto_field_names = true;
              o.always_print_primitive_fields = true;
              if (google::protobuf::util::MessageToJsonString(**got, &text, o).ok())
                doc = Json::parse(text, nullptr, false);
            }
            answers[a] = doc;
          }
          cell = FieldAt(answers[a], p);
        } else if (succeeded) {
          cell = Series(row.run_id(), p);
        }
        *row.add_values() = FromJson(cell);
      }
    }
    tables[s.name()] = std::move(*summary);
  }
  if (pending > 0) {
    const std::string phase =
        "analysing: " + std::to_string(pending) + " of " + std::to_string(asked) + " analyses and labels pending";
    const bool changed = phase != r->phase();
    r->set_phase(phase);
    r->set_progress(0.8 + 0.2 * (asked == 0 ? 1.0 : 1.0 - static_cast<double>(pending) / asked));
    return changed;
  }
  *r->mutable_report() = EvaluateChecks(scale, tables, static_cast<int>(r->seeds()), std::move(notes));
  BoundReport(r->mutable_report(), kMaxReportBytes);
  const int64_t now = NowUs();
  SetTime(now, r->mutable_finished_at());
  r->mutable_report()->set_wall_seconds(static_cast<double>(now - MicrosOf(r->created_at())) / 1e6);
  r->set_state(v1::REPRODUCTION_STATE_DONE);
  r->set_progress(1);
  r->set_phase("done: " + std::to_string(r->report().passed()) + " passed, " + std::to_string(r->report().failed()) +
               " failed, " + std::to_string(r->report().inconclusive()) + " inconclusive");
  return true;
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
    return absl::ResourceExhaustedError(
        "recipe " + recipe.id() + " scale " + request.scale() + ": its report would hold at least " +
        std::to_string(least) + " bytes (the checks' texts, and their constants once per seed), more than a "
        "report may (" + std::to_string(kMaxReportBytes) + "); shorten the constants or lower seeds");
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
    total += members * seeds;
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
