#include "server/store/store.h"

#include <gtest/gtest.h>

#include <chrono>

#include <thread>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::store {
namespace {

using circuitlab::testing::TempDir;

NewRun SampleRun(const std::string& name, std::vector<std::string> tags = {}, int priority = 0) {
  NewRun r;
  r.name = name;
  r.spec = "spec-bytes";
  r.spec_json = "{}";
  r.state = 1;
  r.priority = priority;
  r.total_steps = 100;
  r.created_at_us = 1;
  r.tags = std::move(tags);
  r.owner = "tester";
  return r;
}

TEST(StoreTest, InsertGetAndTransition) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto id = (*store)->InsertRun(SampleRun("a", {"x", "y"}));
  ASSERT_TRUE(id.ok()) << id.status();
  auto row = (*store)->GetRun(*id);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->name, "a");
  EXPECT_EQ(row->spec, "spec-bytes");
  EXPECT_EQ(row->tags, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(row->state, 1);

  RunTransition t;
  t.state = 2;
  t.device = "cpu:0";
  t.started_at_us = 42;
  t.increment_attempts = true;
  t.from_states = {1};
  ASSERT_TRUE((*store)->TransitionRun(*id, t).ok());
  row = (*store)->GetRun(*id);
  EXPECT_EQ(row->state, 2);
  EXPECT_EQ(row->device, "cpu:0");
  EXPECT_EQ(row->started_at_us, 42);
  EXPECT_EQ(row->attempts, 1);

  // started_at is only written once; from_states is enforced.
  t.started_at_us = 99;
  t.from_states = {1};
  EXPECT_EQ((*store)->TransitionRun(*id, t).code(), absl::StatusCode::kFailedPrecondition);
  t.from_states = {2};
  ASSERT_TRUE((*store)->TransitionRun(*id, t).ok());
  EXPECT_EQ((*store)->GetRun(*id)->started_at_us, 42);
}

TEST(StoreTest, UnknownRunIsNotFound) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetRun(7).status().code(), absl::StatusCode::kNotFound);
  RunTransition t;
  t.state = 2;
  EXPECT_EQ((*store)->TransitionRun(7, t).code(), absl::StatusCode::kNotFound);
}

TEST(StoreTest, ListFiltersByStateAndTagsAndPaginates) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 7; ++i) {
    NewRun r = SampleRun("run" + std::to_string(i), i % 2 == 0 ? std::vector<std::string>{"even", "all"}
                                                               : std::vector<std::string>{"all"});
    r.state = i < 3 ? 1 : 3;
    ASSERT_TRUE((*store)->InsertRun(r).ok());
  }
  RunFilter f;
  f.tags = {"even", "all"};
  auto page = (*store)->ListRuns(f);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->total, 4);
  ASSERT_EQ(page->runs.size(), 4u);
  EXPECT_EQ(page->runs[0].name, "run6");  // newest first

  f = RunFilter();
  f.states = {1};
  page = (*store)->ListRuns(f);
  EXPECT_EQ(page->total, 3);

  f = RunFilter();
  f.limit = 3;
  page = (*store)->ListRuns(f);
  ASSERT_EQ(page->runs.size(), 3u);
  f.before_id = page->runs.back().id;
  auto page2 = (*store)->ListRuns(f);
  ASSERT_EQ(page2->runs.size(), 3u);
  EXPECT_LT(page2->runs[0].id, page->runs.back().id);
  EXPECT_EQ(page2->total, 7);
}

TEST(StoreTest, MetricsBatchReplaceAndDownsample) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  auto id = (*store)->InsertRun(SampleRun("m"));
  for (int step = 1; step <= 1000; ++step) {
    (*store)->AppendMetrics(*id, {{"train/loss", step, 1.0 / step}, {"eval/acc", step, step * 0.001}});
  }
  // A resumed run recomputes a step: the new value replaces the old.
  (*store)->AppendMetrics(*id, {{"train/loss", 10, 123.0}});
  ASSERT_TRUE((*store)->Flush().ok());

  MetricQuery q;
  q.names = {"train/loss"};
  auto series = (*store)->GetMetrics(*id, q);
  ASSERT_TRUE(series.ok());
  ASSERT_EQ(series->size(), 1u);
  EXPECT_EQ((*series)[0].total_points, 1000);
  EXPECT_EQ((*series)[0].values[9], 123.0);

  q.min_step = 100;
  q.max_step = 199;
  q.max_points = 10;
  series = (*store)->GetMetrics(*id, q);
  const MetricSeries& s = (*series)[0];
  EXPECT_EQ(s.total_points, 100);
  EXPECT_LE(s.steps.size(), 10u);
  EXPECT_GE(s.steps.size(), 9u);
  EXPECT_EQ(s.steps.front(), 100);
  EXPECT_EQ(s.steps.back(), 199);  // the last point of the range is always kept

  // The cap over all series of one answer downsamples every series further.
  q = MetricQuery();
  q.max_total_points = 100;
  series = (*store)->GetMetrics(*id, q);
  ASSERT_EQ(series->size(), 2u);
  for (const auto& s2 : *series) {
    EXPECT_LE(s2.steps.size(), 50u);
    EXPECT_EQ(s2.steps.back(), 1000);
  }

  auto latest = (*store)->LatestMetrics(*id);
  ASSERT_TRUE(latest.ok());
  EXPECT_DOUBLE_EQ(latest->at("train/loss"), 1.0 / 1000);
  EXPECT_DOUBLE_EQ(latest->at("eval/acc"), 1.0);
  EXPECT_EQ(latest->size(), 2u) << "one value per series, none from other runs";
  NewRun other;
  other.name = "no metrics";
  auto empty = (*store)->LatestMetrics(*(*store)->InsertRun(other));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
}

TEST(StoreTest, CheckpointsAreAtomicVerifiedAndPruned) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  auto id = (*store)->InsertRun(SampleRun("c"));
  auto none = (*store)->LatestCheckpoint(*id);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  for (int step : {10, 20, 30}) {
    ASSERT_TRUE((*store)->PutCheckpoint(*id, step, "payload-" + std::to_string(step), /*keep=*/2).ok());
  }
  auto latest = (*store)->LatestCheckpoint(*id);
  ASSERT_TRUE(latest.ok());
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->step, 30);
  EXPECT_EQ((*latest)->bytes, "payload-30");
  EXPECT_EQ((*store)->GetRun(*id)->checkpoint_step, 30);
  // Only the newest two files remain, and no temp files.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path() + "/checkpoints/r" + std::to_string(*id))) {
    EXPECT_EQ(e.path().extension(), ".ckpt");
    ++files;
  }
  EXPECT_EQ(files, 2);

  // A corrupted file is detected, not loaded.
  std::ofstream(dir.path() + "/checkpoints/r" + std::to_string(*id) + "/step-000000000030.ckpt") << "payload-31";
  EXPECT_EQ((*store)->LatestCheckpoint(*id).status().code(), absl::StatusCode::kDataLoss);
  // Resuming passes over it to the newest intact one, saying why (issue 14
  // item 7); with none intact, nothing (step 0).
  std::vector<std::string> skipped;
  auto intact = (*store)->LatestIntactCheckpoint(*id, &skipped);
  ASSERT_TRUE(intact.ok()) << intact.status();
  ASSERT_TRUE(intact->has_value());
  EXPECT_EQ((*intact)->step, 20);
  EXPECT_EQ((*intact)->bytes, "payload-20");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step 30: checkpoint checkpoints/r1/step-000000000030.ckpt does not match its checksum"),
            std::string::npos)
      << skipped[0];
  std::filesystem::remove(dir.path() + "/checkpoints/r" + std::to_string(*id) + "/step-000000000020.ckpt");
  skipped.clear();
  intact = (*store)->LatestIntactCheckpoint(*id, &skipped);
  ASSERT_TRUE(intact.ok());
  EXPECT_FALSE(intact->has_value());
  EXPECT_EQ(skipped.size(), 2u);
  // What clients read names files relative to the data directory, never where
  // the server keeps it (issue 32 item 9).
  EXPECT_NE(skipped[1].find("checkpoint file missing: checkpoints/r1/step-000000000020.ckpt"), std::string::npos)
      << skipped[1];
  for (const std::string& why : skipped) EXPECT_EQ(why.find(dir.path()), std::string::npos) << why;
  ASSERT_TRUE((*store)->SetRunWarning(*id, "resumed from step 0").ok());
  EXPECT_EQ((*store)->GetRun(*id)->warning, "resumed from step 0");
}

// Issue 14 item 11: deleting ended runs removes every row that hangs off
// them and their checkpoint files, all or nothing; ids are never reused.
TEST(StoreTest, DeletingRunsRemovesEverythingAndNeverReusesIds) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  Store& st = **store;
  NewRun ended = SampleRun("ended", {"t"});
  ended.state = 3;
  const int64_t a = *st.InsertRun(ended), b = *st.InsertRun(SampleRun("queued"));  // state 1
  st.AppendMetrics(a, {{"train/loss", 5, 0.5}});
  ASSERT_TRUE(st.PutCheckpoint(a, 5, "five", 0).ok());
  ASSERT_TRUE(st.PutAnalysis(a, "project", 1, "req", "res").ok());
  ASSERT_TRUE(st.Flush().ok());
  // A run in another state stops the whole deletion.
  auto refused = st.DeleteRuns({a, b}, {3, 4, 5});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("run r2 has not ended"), absl::string_view::npos) << refused.status();
  EXPECT_TRUE(st.GetRun(a).ok()) << "all or nothing";
  EXPECT_EQ(st.DeleteRuns({99}, {3}).status().code(), absl::StatusCode::kNotFound);
  auto freed = st.DeleteRuns({a}, {3, 4, 5});
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 4);  // "five"
  EXPECT_EQ(st.GetRun(a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/checkpoints/r" + std::to_string(a)));
  EXPECT_FALSE(st.GetAnalysis(a, "project", 1)->has_value());
  EXPECT_EQ(*st.InsertRun(SampleRun("next")), b + 1);
}

// Issue 14 item 4: a page of runs ends early once its specs reach
// max_bytes (at least one run), so one ListRuns answer stays bounded.
TEST(StoreTest, RunPagesAreBoundedInBytes) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 5; ++i) {
    NewRun r = SampleRun("big");
    r.spec = std::string(1000, 'x');
    ASSERT_TRUE((*store)->InsertRun(r).ok());
  }
  RunFilter f;
  f.limit = 50;
  f.max_bytes = 2500;
  auto page = (*store)->ListRuns(f);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->runs.size(), 3u);  // 1,000 + 1,000 + 1,000 >= 2,500
  EXPECT_TRUE(page->cut);
  EXPECT_EQ(page->total, 5);
  f.max_bytes = 10;
  EXPECT_EQ((*store)->ListRuns(f)->runs.size(), 1u) << "at least one run";
}

// Issue 14 item 9: a backup taken while the store is open is a complete
// data directory; a database that lost runs the disk still holds is refused.
TEST(StoreTest, BackupWhileOpenAndLostRunsAreRefused) {
  TempDir dir;
  const std::string data = dir.path() + "/data", copy = dir.path() + "/copy";
  {
    auto store = Store::Open(data);
    ASSERT_TRUE(store.ok());
    const int64_t id = *(*store)->InsertRun(SampleRun("b"));
    ASSERT_TRUE((*store)->PutCheckpoint(id, 3, "three", 0).ok());
    ASSERT_TRUE((*store)->Flush().ok());
    ASSERT_TRUE(Store::Backup(data, copy).ok());
    EXPECT_EQ(Store::Backup(data, copy).code(), absl::StatusCode::kAlreadyExists) << "never over a backup";
    // Never into the data directory itself or a folder inside it, which would
    // copy into itself until the disk is full (issue 32 item 5); nothing is
    // left behind.
    for (const std::string& inside : {data, data + "/checkpoints/nest", data + "/./x/../checkpoints/r1/more"}) {
      const absl::Status s = Store::Backup(data, inside);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << inside << ": " << s;
      EXPECT_NE(s.message().find("is inside --data"), absl::string_view::npos) << s;
    }
    EXPECT_FALSE(std::filesystem::exists(data + "/checkpoints/nest"));
    EXPECT_FALSE(std::filesystem::exists(data + "/checkpoints/r1/more"));
  }
  {
    auto restored = Store::Open(copy);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ((*restored)->GetRun(1)->name, "b");
    EXPECT_EQ((*(*restored)->LatestCheckpoint(1))->bytes, "three");
  }
  std::filesystem::remove(copy + "/circuitlab.db");
  auto lost = Store::Open(copy);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lost.status().message().find("has lost runs that the disk still holds (checkpoints/r1, beyond the "
                                         "database's last run r0)"),
            absl::string_view::npos)
      << lost.status();
}

// Checkpoint rows hold paths relative to the data directory (issue 14 item
// 8): a directory moved or mounted elsewhere still finds its checkpoints.
TEST(StoreTest, AMovedDataDirectoryKeepsItsCheckpoints) {
  TempDir a, b;
  int64_t id = 0;
  {
    auto store = Store::Open(a.path() + "/data");
    ASSERT_TRUE(store.ok());
    id = *(*store)->InsertRun(SampleRun("m"));
    ASSERT_TRUE((*store)->PutCheckpoint(id, 7, "seven", 0).ok());
    ASSERT_TRUE((*store)->Flush().ok());
  }
  std::filesystem::rename(a.path() + "/data", b.path() + "/moved");
  auto store = Store::Open(b.path() + "/moved");
  ASSERT_TRUE(store.ok()) << store.status();
  auto c = (*store)->LatestCheckpoint(id);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->bytes, "seven");
}

TEST(StoreTest, CoordinatesAreDescribedOnceAndQueriedBySeriesAndByStep) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  const int64_t id = *(*store)->InsertRun(SampleRun("coords"));
  std::vector<CoordinateDefRow> defs;
  for (int i = 0; i < 5; ++i) {
    CoordinateDefRow d;
    d.index = i;
    d.label = "L1H1:[∅→∅]:S_" + std::to_string(i);
    d.canonical = i == 1 ? "alpha" : "";
    d.matrix = "L1H1";
    d.layer = 1;
    d.head = 1;
    d.element = "S_" + std::to_string(i);
    d.norm = 4.0;
    defs.push_back(d);
  }
  auto ids = (*store)->PutCoordinateDefs(id, "paper", defs);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 5u);
  // A resumed run describes its basis again: same ids, nothing duplicated.
  auto again = (*store)->PutCoordinateDefs(id, "paper", defs);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *ids);
  defs.pop_back();
  EXPECT_EQ((*store)->PutCoordinateDefs(id, "paper", defs).status().code(), absl::StatusCode::kFailedPrecondition);

  for (int step = 0; step <= 100; step += 10) {
    std::vector<double> values;
    for (int i = 0; i < 5; ++i) values.push_back(step * 0.01 * i);
    (*store)->AppendCoordinates(id, step, *ids, values);
  }
  ASSERT_TRUE((*store)->Flush().ok());

  TrajectoryQuery q;
  q.names = {"alpha", "L1H1:[∅→∅]:S_3"};
  auto series = (*store)->GetTrajectory(id, q);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ(series->size(), 2u);
  EXPECT_EQ((*series)[0].def.canonical, "alpha");
  EXPECT_EQ((*series)[0].steps.size(), 11u);
  EXPECT_DOUBLE_EQ((*series)[1].values.back(), 3.0);
  q.names.clear();
  q.selection = "complete";
  EXPECT_TRUE((*store)->GetTrajectory(id, q)->empty());

  auto other = *(*store)->InsertRun(SampleRun("coords-2"));
  auto other_ids = *(*store)->PutCoordinateDefs(other, "paper", defs);
  (*store)->AppendCoordinates(other, 30, other_ids, {0.5, 0.25, 0.0, 0.0});
  ASSERT_TRUE((*store)->Flush().ok());
  auto last = (*store)->LastCoordinateOfRuns({id, other, 999}, "paper", "L1H1:[∅→∅]:S_1");
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->size(), 2u);
  EXPECT_EQ((*last)[0].step, 100);
  EXPECT_DOUBLE_EQ((*last)[0].value, 1.0);
  EXPECT_EQ((*last)[1].run_id, other);
  EXPECT_DOUBLE_EQ((*last)[1].value, 0.25);

  auto at = (*store)->CoordinatesAt(id, "paper", 50);
  ASSERT_TRUE(at.ok());
  ASSERT_EQ(at->size(), 5u);
  EXPECT_EQ((*at)[2].first.element, "S_2");
  EXPECT_DOUBLE_EQ((*at)[2].second, 1.0);
}

TEST(StoreTest, AnalysesAreStoredByRequestHash) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  const int64_t id = *(*store)->InsertRun(SampleRun("analyses"));
  EXPECT_FALSE((*store)->GetAnalysis(id, "project", 42)->has_value());
  ASSERT_TRUE((*store)->PutAnalysis(id, "project", 42, "request", "result-1").ok());
  ASSERT_TRUE((*store)->PutAnalysis(id, "project", 42, "request", "result-2").ok());  // forced recompute
  EXPECT_EQ(**(*store)->GetAnalysis(id, "project", 42), "result-2");
  EXPECT_FALSE((*store)->GetAnalysis(id, "project", 43)->has_value());
  ASSERT_TRUE((*store)->PutCheckpoint(id, 5, "five", 0).ok());
  ASSERT_TRUE((*store)->PutCheckpoint(id, 9, "nine", 0).ok());
  EXPECT_EQ((*(*store)->CheckpointAt(id, 5))->bytes, "five");
  EXPECT_FALSE((*store)->CheckpointAt(id, 6)->has_value());
  EXPECT_EQ(*(*store)->CheckpointSteps(id), (std::vector<int64_t>{5, 9}));
}

// The dashboard's interventions page: a run's stored answers of one kind,
// newest first, bounded, with their requests.
TEST(StoreTest, AnalysesOfOneKindAreListedNewestFirst) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  const int64_t id = *(*store)->InsertRun(SampleRun("listed"));
  const int64_t other = *(*store)->InsertRun(SampleRun("other"));
  EXPECT_TRUE((*store)->ListAnalyses(id, "intervene", 10)->empty());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*store)->PutAnalysis(id, "intervene", 100 + i, "request-" + std::to_string(i),
                                      "result-" + std::to_string(i))
                    .ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // distinct stored times
  }
  ASSERT_TRUE((*store)->PutAnalysis(id, "project", 7, "a projection", "not listed").ok());
  ASSERT_TRUE((*store)->PutAnalysis(other, "intervene", 100, "another run's", "not listed").ok());
  auto all = (*store)->ListAnalyses(id, "intervene", 10);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].request, "request-2");
  EXPECT_EQ((*all)[0].result, "result-2");
  EXPECT_EQ((*all)[2].request, "request-0");
  EXPECT_GT((*all)[0].created_at, (*all)[2].created_at);
  auto two = (*store)->ListAnalyses(id, "intervene", 2);
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].request, "request-1");
}

// Pages of a run's stored answers: each one once, in order; a byte budget
// ends a page early (always one), saying so.
TEST(StoreTest, StoredAnswersListInPages) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  const int64_t id = *(*store)->InsertRun(SampleRun("paged"));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*store)->PutAnalysis(id, "intervene", 10 + i, std::string(1000, 'a' + i), "r").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<int64_t> seen;
  std::optional<Store::AnalysisCursor> after;
  for (int page = 0; page < 10; ++page) {
    bool cut = false;
    auto rows = (*store)->ListAnalyses(id, "intervene", 2, after, 0, &cut);
    ASSERT_TRUE(rows.ok());
    EXPECT_FALSE(cut);
    for (const auto& r : *rows) seen.push_back(r.request_hash);
    if (rows->size() < 2u) break;
    after = Store::AnalysisCursor{rows->back().created_at, rows->back().request_hash};
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{14, 13, 12, 11, 10}));
  bool cut = false;
  auto budget = (*store)->ListAnalyses(id, "intervene", 5, std::nullopt, 2500, &cut);
  ASSERT_EQ(budget->size(), 2u) << "1001 + 1001 bytes fit 2500, a third does not";
  EXPECT_TRUE(cut);
  auto one = (*store)->ListAnalyses(id, "intervene", 5, std::nullopt, 10, &cut);
  EXPECT_EQ(one->size(), 1u) << "a page has at least one";
  auto got = (*store)->GetStoredAnalysis(id, "intervene", 12);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->request, std::string(1000, 'c'));
  EXPECT_FALSE((*store)->GetStoredAnalysis(id, "intervene", 99)->has_value());
}

// Issue 51 item 7: stored answers grew the store without bound (each
// distinct attention seed added 16.8 MB). They count against the quota of
// the principal whose job computed them: storing past it deletes that
// principal's oldest, never another's, never the one just stored.
TEST(StoreTest, StoredAnswersStayWithinTheirOwnersQuota) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  const int64_t id = *(*store)->InsertRun(SampleRun("quota"));
  const std::string mb(1 << 20, 'x');
  ASSERT_TRUE((*store)->PutAnalysis(id, "attention", 1, "bob", mb, "bob", 3 << 20).ok());
  for (int seed = 2; seed <= 10; ++seed) {
    int evicted = 0;
    ASSERT_TRUE((*store)->PutAnalysis(id, "attention", 100 + seed, "seed", mb, "ana", 3 << 20, &evicted).ok());
    EXPECT_EQ(evicted, seed <= 3 ? 0 : 1) << "seed " << seed;
    EXPECT_LE(*(*store)->StoredAnalysisBytes("ana"), 3 << 20);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_FALSE((*store)->GetAnalysis(id, "attention", 102)->has_value()) << "ana's oldest went";
  EXPECT_TRUE((*store)->GetAnalysis(id, "attention", 110)->has_value()) << "the newest stays";
  EXPECT_TRUE((*store)->GetAnalysis(id, "attention", 1)->has_value()) << "bob's is not ana's to lose";
  EXPECT_EQ(*(*store)->StoredAnalysisBytes("bob"), (1 << 20) + 3);
  // One answer larger than the quota alone is still stored (the others go).
  int evicted = 0;
  ASSERT_TRUE((*store)->PutAnalysis(id, "attention", 200, "big", std::string(4 << 20, 'y'), "ana", 3 << 20, &evicted).ok());
  EXPECT_EQ(evicted, 2);
  EXPECT_TRUE((*store)->GetAnalysis(id, "attention", 200)->has_value());
}

TEST(StoreTest, SecondOpenOfTheSameDirectoryIsRefused) {
  TempDir dir;
  auto first = Store::Open(dir.path());
  ASSERT_TRUE(first.ok());
  auto second = Store::Open(dir.path());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  first->reset();
  EXPECT_TRUE(Store::Open(dir.path()).ok());
}

TEST(StoreTest, DataSurvivesReopen) {
  TempDir dir;
  int64_t id;
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok());
    id = *(*store)->InsertRun(SampleRun("persist"));
    (*store)->AppendMetrics(id, {{"train/loss", 1, 0.5}});
    (*store)->RecordProgress(id, 7);
  }  // closing flushes the queued batch
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetRun(id)->step, 7);
  EXPECT_EQ((*store)->LatestMetrics(id)->at("train/loss"), 0.5);
}

TEST(StoreTest, RefusesADatabaseNewerThanTheBinary) {
  TempDir dir;
  { ASSERT_TRUE(Store::Open(dir.path()).ok()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/circuitlab.db").c_str(), &db), SQLITE_OK);
  const std::string sql = "PRAGMA user_version = " + std::to_string(LatestSchemaVersion() + 1);
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = Store::Open(dir.path());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("newer than this binary"), std::string::npos);
}

TEST(StoreTest, NotADatabaseIsDataLoss) {
  TempDir dir;
  std::ofstream(dir.path() + "/circuitlab.db") << std::string(4096, 'x');
  auto store = Store::Open(dir.path());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
}

TEST(StoreTest, ManyConcurrentWritersAndReaders) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  auto id = *(*store)->InsertRun(SampleRun("concurrent"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int step = 0; step < 500; ++step) {
        (*store)->AppendMetrics(id, {{absl::StrCat("m", t), step, static_cast<double>(step)}});
        if (step % 50 == 0) {
          ASSERT_TRUE((*store)->GetRun(id).ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE((*store)->Flush().ok());
  auto series = (*store)->GetMetrics(id, {});
  ASSERT_EQ(series->size(), 4u);
  for (const auto& s : *series) EXPECT_EQ(s.total_points, 500);
}

}  // namespace
}  // namespace circuitlab::store
