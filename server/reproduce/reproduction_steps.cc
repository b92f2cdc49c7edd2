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
#include <vector>

#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/reproduce/recipes.h"
#include "server/reproduce/report.h"
#include "server/reproduce/reproduction_records.h"
#include "server/reproduce/reproductions.h"

// The job's steps, each from the stored record so that a restarted server
// resumes: train (submit each seed's sweeps, or reuse an identical
// experiment's runs), then analyse (ask the analyses, read the summaries and
// series, evaluate the checks).

namespace circuitlab::reproduce {
namespace {

using Json = nlohmann::json;

// What reuse reads of the owner's earlier reproductions' records at most.
constexpr int64_t kMaxReuseBytes = 64 << 20;

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
        const std::string last =
            field.substr(field.find_last_of("./") == std::string::npos ? 0 : field.find_last_of("./") + 1);
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

// Analysis `a` of run `run_id` as JSON (its stored answer, or a job it
// starts): null while pending (counted in `pending`) or when it failed (a
// line in `notes`).
Json Answer(scheduler::AnalysisCore& analyses, const v1::RecipeAnalysis& a, const std::string& run_id,
            const std::string& owner, int* pending, std::vector<std::string>* notes) {
  absl::StatusOr<std::unique_ptr<google::protobuf::Message>> got =
      analyses.Run(*RequestFor(a, run_id), scheduler::Requester(owner));
  if (!got.ok()) {
    notes->push_back("analysis " + a.name() + " on " + run_id + ": " + std::string(got.status().message()));
    return nullptr;
  }
  if (scheduler::IsPendingResponse(**got)) {
    ++*pending;
    return nullptr;
  }
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(**got, &text, o).ok()) return nullptr;
  return Json::parse(text, nullptr, false);
}

}  // namespace

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
            answers[a] = Answer(*analyses_, *a, row.run_id(), r->owner(), &pending, &notes);
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

}  // namespace circuitlab::reproduce
