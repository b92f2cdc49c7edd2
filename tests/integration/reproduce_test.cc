// ReproductionService over gRPC on a fake executor: the errors that name
// the field, a reproduction carried to its report, access rules, and a
// restart in the middle that resumes it without retraining its finished run
// (issue 34).
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "server/reproduce/render.h"
#include "tests/integration/integration_util.h"
#include "tests/test_util/fake_analyzer.h"

namespace circuitlab::testing {
namespace {

// Two runs (20 and 300 steps of 10 ms on the fake executor); checks on the
// fake metrics (train/step = step, train/loss = 1/step).
v1::Recipe TwoRunRecipe() {
  v1::Recipe r;
  const std::string spec = client::ToJson(TinySpec(20), false);
  const std::string json = R"({"id": "T.1", "title": "two runs", "scales": {"ci": {
    "sweeps": [{"name": "runs", "sweep": {"base": )" +
                           spec + R"(,
                "axes": [{"field": "training.steps", "name": "steps", "values": [20, 300]}]}}],
    "checks": [
      {"id": "longest", "description": "the long run reached its last step",
       "value": {"column": {"sweep": "runs", "column": "train/step", "reduce": "REDUCE_MAX"}},
       "comparison": "COMPARISON_EQ", "against": {"constant": 300}},
      {"id": "loss_falls", "description": "the loss falls over training",
       "value": {"column": {"sweep": "runs", "column": "series:train/loss", "reduce": "REDUCE_SPEARMAN_WITH_STEP",
                            "where": {"steps": 300}}},
       "comparison": "COMPARISON_LE", "against": {"constant": -0.99}},
      {"id": "too_much", "description": "a check that fails",
       "value": {"column": {"sweep": "runs", "column": "train/step", "reduce": "REDUCE_MIN"}},
       "comparison": "COMPARISON_GT", "against": {"constant": 1000}}],
    "figures": [
      {"title": "the step over training", "kind": "KIND_SERIES", "sweep": "runs", "columns": ["series:train/step"]},
      {"title": "the final loss", "kind": "KIND_BARS", "sweep": "runs", "columns": ["train/loss"]}]}}})";
  auto s = google::protobuf::util::JsonStringToMessage(json, &r);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

// StartReproduction of TwoRunRecipe at ci scale.
v1::StartReproductionRequest TwoRunRequest() {
  v1::StartReproductionRequest req;
  *req.mutable_recipe() = TwoRunRecipe();
  req.set_scale("ci");
  return req;
}

v1::Reproduction WaitForReproduction(client::Client& c, const std::string& id, v1::ReproductionState want) {
  v1::Reproduction r;
  WaitFor(
      [&] {
        auto got = c.GetReproduction(id);
        if (got.ok()) r = *got;
        return r.state() == want || r.state() == v1::REPRODUCTION_STATE_FAILED;
      },
      std::chrono::seconds(60));
  return r;
}

TEST(ReproductionTest, StartsRefusesAndReports) {
  TempDir dir;
  FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  auto recipes = c.ListRecipes();
  ASSERT_TRUE(recipes.ok()) << recipes.status();
  ASSERT_GE(recipes->recipes_size(), 1);
  EXPECT_EQ(recipes->recipes(0).scales_size(), 3);

  v1::StartReproductionRequest req;
  req.set_recipe_id("E.99");
  req.set_scale("ci");
  auto bad = c.StartReproduction(req);
  EXPECT_TRUE(absl::IsNotFound(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("E.9"), std::string::npos) << "names the recipes there are";
  req.set_recipe_id("E.9");
  req.set_scale("gpu");
  bad = c.StartReproduction(req);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("ci, cpu, paper"), std::string::npos) << bad.status();
  req.set_scale("ci");
  req.set_seeds(17);
  bad = c.StartReproduction(req);
  EXPECT_NE(bad.status().message().find("seeds must be in [1, 16], got 17"), std::string::npos) << bad.status();
  req.clear_recipe_id();
  req.set_seeds(1);
  *req.mutable_recipe() = TwoRunRecipe();
  {  // A check that holds on at least 2 seeds cannot be decided on 1.
    v1::RecipeCheck* check = (*req.mutable_recipe()->mutable_scales())["ci"].mutable_checks(0);
    check->set_aggregate(v1::RecipeCheck::AGGREGATE_AT_LEAST);
    check->set_at_least(2);
    bad = c.StartReproduction(req);
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
    EXPECT_NE(bad.status().message().find("seeds must be at least 2 for check longest"), std::string::npos)
        << bad.status();
    *req.mutable_recipe() = TwoRunRecipe();
  }
  (*req.mutable_recipe()->mutable_scales())["ci"]
      .mutable_sweeps(0)
      ->mutable_sweep()
      ->mutable_base()
      ->mutable_training()
      ->set_batch_size(0);
  (*req.mutable_recipe()->mutable_scales())["ci"]
      .mutable_sweeps(0)
      ->mutable_sweep()
      ->mutable_base()
      ->mutable_training()
      ->set_learning_rate(-1);
  bad = c.StartReproduction(req);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("sweep runs member"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("learning_rate"), std::string::npos) << bad.status();

  *req.mutable_recipe() = TwoRunRecipe();
  {  // A slope against an axis (E.5's form) reads the axis, not a column of its name.
    v1::RecipeCheck* slope = (*req.mutable_recipe()->mutable_scales())["ci"].add_checks();
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                    R"({"id": "slope", "description": "the last step against the steps", "report_only": true,
                        "value": {"column": {"sweep": "runs", "column": "train/step", "reduce": "REDUCE_SLOPE_LOGLOG",
                                             "other": "steps"}},
                        "comparison": "COMPARISON_GE", "against": {"constant": 0.99}})",
                    slope)
                    .ok());
  }
  auto started = c.StartReproduction(req);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->reproduction_id(), "p1");
  const v1::Reproduction done = WaitForReproduction(c, "p1", v1::REPRODUCTION_STATE_DONE);
  ASSERT_EQ(done.state(), v1::REPRODUCTION_STATE_DONE) << done.error() << " " << done.phase();
  ASSERT_EQ(done.report().checks_size(), 4);
  EXPECT_EQ(done.report().checks(3).outcome(), v1::CHECK_OUTCOME_REPORTED) << done.report().checks(3).note();
  EXPECT_NEAR(done.report().checks(3).mean(), 1.0, 1e-9) << "train/step is the steps axis on the fake executor";
  EXPECT_EQ(done.report().checks(0).outcome(), v1::CHECK_OUTCOME_PASS) << done.report().checks(0).note();
  EXPECT_EQ(done.report().checks(1).outcome(), v1::CHECK_OUTCOME_PASS) << done.report().checks(1).note();
  EXPECT_EQ(done.report().checks(2).outcome(), v1::CHECK_OUTCOME_FAIL);
  EXPECT_EQ(done.report().passed(), 2u);
  EXPECT_EQ(done.report().tables().at("runs").rows_size(), 2);
  // The figures' columns join the table (no check reads these two).
  const auto& columns = done.report().tables().at("runs").columns();
  EXPECT_NE(std::find(columns.begin(), columns.end(), "series:train/step"), columns.end());
  EXPECT_NE(std::find(columns.begin(), columns.end(), "train/loss"), columns.end());
  EXPECT_EQ(std::find(columns.begin(), columns.end(), "steps"), columns.end()) << "an axis is not a column";
  EXPECT_EQ(done.recipe().scales().at("ci").figures_size(), 2);
  EXPECT_DOUBLE_EQ(done.progress(), 1.0);
  EXPECT_TRUE(absl::IsFailedPrecondition(c.CancelReproduction("p1").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(c.GetReproduction("x1").status()));
  EXPECT_TRUE(absl::IsNotFound(c.GetReproduction("p7").status()));
  v1::ListReproductionsRequest list;
  auto listed = c.ListReproductions(list);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->reproductions_size(), 1);
  EXPECT_FALSE(listed->reproductions(0).has_recipe()) << "listings leave the recipe out";
  EXPECT_TRUE(listed->reproductions(0).report().tables().empty());
}

// Issue 34: a restart in the middle resumes the reproduction; its finished
// run is not trained again, its sweep not submitted again.
TEST(ReproductionTest, ARestartResumesWithoutRetraining) {
  TempDir dir;
  std::string sweep_id;
  {
    FakeExecutor exec;
    exec.step_time = std::chrono::milliseconds(10);
    Server server(dir.path(), &exec);
    auto c = MakeClient(server.address());
    ASSERT_TRUE(c.StartReproduction(TwoRunRequest()).ok());
    // The first run done and the second started (the slot frees a moment
    // before the scheduler hands it on: CI once looked in between).
    ASSERT_TRUE(WaitFor([&] {
      v1::ListRunsRequest q;
      q.add_states(v1::RUN_STATE_SUCCEEDED);
      auto runs = c.ListRuns(q);
      return runs.ok() && runs->runs_size() == 1 && exec.started() == 2;
    })) << "started " << exec.started();
    auto r = c.GetReproduction("p1");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->state(), v1::REPRODUCTION_STATE_TRAINING) << r->phase();
    sweep_id = r->sweeps().at("runs/1");
  }
  FakeExecutor again;
  Server server(dir.path(), &again);
  auto c = MakeClient(server.address());
  const v1::Reproduction done = WaitForReproduction(c, "p1", v1::REPRODUCTION_STATE_DONE);
  ASSERT_EQ(done.state(), v1::REPRODUCTION_STATE_DONE) << done.error();
  EXPECT_EQ(again.started(), 1) << "only the unfinished run trains again";
  EXPECT_EQ(done.sweeps().at("runs/1"), sweep_id);
  EXPECT_EQ(done.sweeps_size(), 1);
  v1::ListRunsRequest all;
  EXPECT_EQ(c.ListRuns(all)->total_size(), 2) << "no run was submitted twice";
  EXPECT_EQ(done.report().passed(), 2u) << done.report().checks(0).note();
}

// Two reproductions of one experiment train it once: the second uses the
// first's sweep (a recipe of its own id and title, names aside, the same
// spec and seed), whether it is still training or done; cancelling one
// leaves the sweep the other still needs; a different seed trains anew.
TEST(ReproductionTest, TheSameExperimentTrainsOnce) {
  TempDir dir;
  FakeExecutor exec;
  exec.step_time = std::chrono::milliseconds(10);
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  v1::StartReproductionRequest req = TwoRunRequest();
  ASSERT_TRUE(c.StartReproduction(req).ok());  // p1
  req.mutable_recipe()->set_id("T.2");
  req.mutable_recipe()->set_title("the same runs, another claim");
  (*req.mutable_recipe()->mutable_scales())["ci"].mutable_sweeps(0)->mutable_sweep()->mutable_base()->set_name("other");
  auto second = c.StartReproduction(req);  // p2, while p1 trains
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(WaitFor([&] {
    auto p2 = c.GetReproduction("p2");
    return p2.ok() && p2->sweeps().contains("runs/1");
  }));
  const std::string shared = c.GetReproduction("p1")->sweeps().at("runs/1");
  EXPECT_EQ(c.GetReproduction("p2")->sweeps().at("runs/1"), shared);
  // Cancelling p2 leaves p1's sweep training.
  ASSERT_TRUE(c.CancelReproduction("p2").ok());
  const v1::Reproduction done = WaitForReproduction(c, "p1", v1::REPRODUCTION_STATE_DONE);
  ASSERT_EQ(done.state(), v1::REPRODUCTION_STATE_DONE) << done.error();
  EXPECT_EQ(done.report().passed(), 2u);
  EXPECT_EQ(exec.started(), 2) << "two runs, trained once";
  // Done, it is still used; a second seed is a new experiment.
  req.set_seeds(2);
  ASSERT_TRUE(c.StartReproduction(req).ok());  // p3
  const v1::Reproduction third = WaitForReproduction(c, "p3", v1::REPRODUCTION_STATE_DONE);
  ASSERT_EQ(third.state(), v1::REPRODUCTION_STATE_DONE) << third.error();
  EXPECT_EQ(third.sweeps().at("runs/1"), shared);
  EXPECT_NE(third.sweeps().at("runs/2"), shared);
  EXPECT_EQ(exec.started(), 4) << "only seed 2's runs trained";
  EXPECT_EQ(third.report().passed(), 2u);
}

// Issue 51 item 1: a writer's 3.7 MB recipe with large constants and 16
// seeds stored a 69.5 MB report, and every list carried the reports whole
// (one GET took the server from 1.4 to 8.5 GB). Now a report that would
// exceed 1 MiB is refused before it starts, and lists are pages of stored
// summaries within a byte budget: three 3.7 MB recipes listed again and
// again cost nothing.
TEST(ReproductionTest, ListsArePagesOfSummariesWithinTheirBudget) {
  TempDir dir;
  FakeExecutor exec;
  app::FrontOptions fronts;
  fronts.http.listen = "127.0.0.1:0";
  Server server(dir.path(), &exec, {}, fronts);
  auto c = MakeClient(server.address());

  // A 200 KB constant in every seed's check: refused up front, no quota spent.
  v1::StartReproductionRequest req = TwoRunRequest();
  (*req.mutable_recipe()->mutable_scales())["ci"].mutable_checks(2)->mutable_against()->mutable_constant()
      ->set_string_value(std::string(200000, 'x'));
  req.set_seeds(16);
  const auto t0 = std::chrono::steady_clock::now();
  auto refused = c.StartReproduction(req);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("1048576"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("lower seeds"), std::string::npos) << refused.status();
  EXPECT_EQ(c.ListRuns(v1::ListRunsRequest())->total_size(), 0);

  // 3.7 MB recipes whose bulk no report copies (a check's `where`).
  req = TwoRunRequest();
  v1::RecipeCheck* wide = (*req.mutable_recipe()->mutable_scales())["ci"].add_checks();
  *wide = req.recipe().scales().at("ci").checks(2);
  wide->set_id("wide");
  (*wide->mutable_value()->mutable_column()->mutable_where())["steps"].set_string_value(std::string(3700000, 'w'));
  for (int i = 1; i <= 3; ++i) {
    auto started = c.StartReproduction(req);
    ASSERT_TRUE(started.ok()) << started.status();
  }
  for (const char* id : {"p1", "p2", "p3"}) {
    ASSERT_EQ(WaitForReproduction(c, id, v1::REPRODUCTION_STATE_DONE).state(), v1::REPRODUCTION_STATE_DONE) << id;
  }

  ASSERT_TRUE(ResetPeakRss()) << "/proc/self/clear_refs cannot be written";
  const Rss before = ReadRss();
  httplib::Client http("127.0.0.1", server.http_port());
  for (int i = 0; i < 20; ++i) {
    auto listed = c.ListReproductions(v1::ListReproductionsRequest());
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_LE(listed->ByteSizeLong(), 1u << 20);
    ASSERT_EQ(listed->reproductions_size(), 3);
    EXPECT_TRUE(listed->next_page_token().empty());
    const v1::Reproduction& r = listed->reproductions(0);
    EXPECT_EQ(r.reproduction_id(), "p3");
    EXPECT_FALSE(r.has_recipe());
    EXPECT_EQ(r.report().passed(), 2u) << "the counts stay";
    EXPECT_EQ(r.report().checks_size(), 0) << "the BASIC view has no checks";
    EXPECT_EQ(r.state(), v1::REPRODUCTION_STATE_DONE);
    auto got = http.Get("/api/v1/reproductions");
    ASSERT_TRUE(got && got->status == 200);
    EXPECT_LE(got->body.size(), 1u << 20);
  }
  // FULL: a page of at most 1 MiB, so one 3.7 MB reproduction a page.
  v1::ListReproductionsRequest full;
  full.set_view(v1::REPRODUCTION_VIEW_FULL);
  std::vector<std::string> ids;
  for (int page = 0; page < 5; ++page) {
    auto listed = c.ListReproductions(full);
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->reproductions_size(), 1);
    EXPECT_TRUE(listed->reproductions(0).has_recipe());
    EXPECT_EQ(listed->reproductions(0).report().checks_size(), 4);
    EXPECT_TRUE(listed->reproductions(0).report().tables().empty());
    ids.push_back(listed->reproductions(0).reproduction_id());
    if (listed->next_page_token().empty()) break;
    full.set_page_token(listed->next_page_token());
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"p3", "p2", "p1"}));
  // The report as the Markdown file the CLI writes (the page's download).
  auto p1 = c.GetReproduction("p1");
  ASSERT_TRUE(p1.ok()) << p1.status();
  auto md = http.Get("/api/v1/reproductions/p1/report.md");
  ASSERT_TRUE(md);
  ASSERT_EQ(md->status, 200) << md->body;
  EXPECT_EQ(md->get_header_value("Content-Type"), "text/markdown; charset=utf-8");
  EXPECT_EQ(md->body, reproduce::ReproductionMarkdown(*p1));
  EXPECT_NE(md->get_header_value("Content-Disposition").find("p1-"), std::string::npos);
  EXPECT_EQ(http.Get("/api/v1/reproductions/p9/report.md")->status, 404);
  const Rss after = ReadRss();
  EXPECT_LE(after.peak - before.now, int64_t{100} << 20) << "peak " << (after.peak >> 20) << " MB, from "
                                                         << (before.now >> 20) << " MB";
  // Pages of one at a time, and the errors that name the field.
  v1::ListReproductionsRequest one;
  one.set_page_size(1);
  one.set_page_token("p3");
  auto second = c.ListReproductions(one);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->reproductions_size(), 1);
  EXPECT_EQ(second->reproductions(0).reproduction_id(), "p2");
  EXPECT_EQ(second->next_page_token(), "p2");
  one.set_page_token("runs");
  EXPECT_NE(c.ListReproductions(one).status().message().find("page_token"), std::string::npos);
  one.clear_page_token();
  one.set_view(static_cast<v1::ReproductionView>(7));
  EXPECT_NE(c.ListReproductions(one).status().message().find("view must be"), std::string::npos);
}

// Issue 51 item 4: 16 parallel starts of a recipe that would make 51,200
// runs were refused only after every member was validated (0.68 s each), and
// meanwhile every other call waited up to 10.6 s. Now the size is known from
// the shape (axes x values x seeds) before anything is expanded, and starts
// run off the threads that serve reads.
TEST(ReproductionTest, OversizedStartsAreRefusedFromTheirShapeWithoutStallingReads) {
  TempDir dir;
  FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  auto run = c.SubmitRun(TinySpec(20));
  ASSERT_TRUE(run.ok());
  v1::StartReproductionRequest req = TwoRunRequest();
  v1::SweepAxis* steps = (*req.mutable_recipe()->mutable_scales())["ci"]
                             .mutable_sweeps(0)->mutable_sweep()->mutable_axes(0);
  steps->clear_values();
  for (int i = 0; i < 80; ++i) steps->add_values()->set_number_value(20 + i);
  v1::SweepAxis* lr = (*req.mutable_recipe()->mutable_scales())["ci"].mutable_sweeps(0)->mutable_sweep()->add_axes();
  lr->set_field("training.learning_rate");
  lr->set_name("lr");
  for (int i = 0; i < 40; ++i) lr->add_values()->set_number_value(0.001 * (i + 1));
  req.set_seeds(16);  // 80 x 40 x 16 = 51,200 runs

  std::atomic<bool> done{false};
  std::vector<double> waits;  // GetRun's latency while the starts go on, in ms
  std::thread reader([&] {
    auto r = MakeClient(server.address());
    while (!done.load() || waits.size() < 50) {
      const auto t = std::chrono::steady_clock::now();
      EXPECT_TRUE(r.GetRun("r1").ok());
      waits.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    }
  });
  std::vector<std::thread> starts;
  std::atomic<int> refused{0};
  std::atomic<int64_t> slowest_us{0};
  for (int i = 0; i < 16; ++i) {
    starts.emplace_back([&] {
      auto mine = MakeClient(server.address());
      const auto t = std::chrono::steady_clock::now();
      auto got = mine.StartReproduction(req);
      const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t).count();
      int64_t seen = slowest_us.load();
      while (us > seen && !slowest_us.compare_exchange_weak(seen, us)) {
      }
      if (absl::IsResourceExhausted(got.status())) ++refused;
      EXPECT_TRUE(absl::IsResourceExhausted(got.status())) << got.status();
    });
  }
  for (auto& t : starts) t.join();
  done = true;
  reader.join();
  EXPECT_EQ(refused.load(), 16);
  std::sort(waits.begin(), waits.end());
  const double p99 = waits[static_cast<size_t>(0.99 * (waits.size() - 1))];
  std::printf("16 oversized starts: slowest refusal %.1f ms; GetRun p99 %.1f ms over %zu calls\n",
              slowest_us.load() / 1000.0, p99, waits.size());
  EXPECT_LT(slowest_us.load(), 1'000'000) << "a refusal from the shape costs nothing";
  EXPECT_LT(p99, 250.0) << "reads stalled by the starts (the issue's bar is 50 ms; CI's machine is loaded)";
  auto again = c.StartReproduction(req);
  EXPECT_NE(again.status().message().find("at most 4096"), std::string::npos) << again.status();
  EXPECT_EQ(c.ListRuns(v1::ListRunsRequest())->total_size(), 1) << "no run submitted, no quota spent";
}

// Cancelling a reproduction cancels the analysis jobs it started, not only
// its sweeps: an intervention that would never end is stopped.
TEST(ReproductionTest, CancelStopsItsAnalysisJobs) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();  // a real checkpoint to analyse
  GatedAnalyzer analyzer;
  Server server(dir.path(), exec.get(), {}, {}, &analyzer);
  auto c = MakeClient(server.address());
  v1::StartReproductionRequest req = TwoRunRequest();
  v1::RecipeScale& scale = (*req.mutable_recipe()->mutable_scales())["ci"];
  scale.mutable_sweeps(0)->mutable_sweep()->clear_axes();
  v1::RecipeAnalysis* a = scale.add_analyses();
  a->set_name("ablate");
  a->set_sweep("runs");
  a->mutable_intervene()->add_interventions()->set_op(v1::Intervention::OP_ABLATE_HEAD);
  a->mutable_intervene()->mutable_interventions(0)->set_layer(1);
  scale.mutable_checks(0)->mutable_value()->mutable_column()->set_column("ablate.effects.0.accuracy");
  auto started = c.StartReproduction(req);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(WaitFor([&] { return analyzer.started.load() == 1; }, std::chrono::seconds(30)));
  ASSERT_TRUE(c.CancelReproduction("p1").ok());
  EXPECT_TRUE(WaitFor([&] {
    auto jobs = c.ListAnalysisJobs();
    return jobs.ok() && jobs->jobs().empty();
  })) << "the intervention job was not cancelled";
  EXPECT_EQ(c.GetReproduction("p1")->state(), v1::REPRODUCTION_STATE_CANCELLED);
}

}  // namespace
}  // namespace circuitlab::testing
