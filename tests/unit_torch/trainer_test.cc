#include "server/engine/train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "server/engine/spec.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

v1::ExperimentSpec SmallSpec(v1::OptimizerKind opt, uint64_t steps = 20) {
  v1::ExperimentSpec spec;
  auto* t = spec.mutable_task()->mutable_associative_recall();
  t->set_num_common(8);
  t->set_num_rare(24);
  t->set_num_heldout(8);
  t->set_num_blocks(4);
  t->set_num_positions(12);
  spec.mutable_training()->set_optimizer(opt);
  spec.mutable_training()->set_batch_size(32);
  spec.mutable_training()->set_steps(steps);
  if (opt == v1::OPTIMIZER_KIND_SGD) {
    spec.mutable_training()->set_learning_rate(4.0);
    spec.mutable_training()->set_momentum(0.9);
  } else {
    spec.mutable_training()->set_learning_rate(1e-2);
  }
  spec.mutable_model()->mutable_imir()->set_init_std(0.1);
  spec.mutable_recording()->set_eval_size(64);
  EXPECT_TRUE(ResolveSpec({}, &spec).ok());
  return spec;
}

double ValueOf(const std::vector<Metric>& ms, const std::string& name) { return testing::MetricValue(ms, name); }

class EnsembleTest : public ::testing::TestWithParam<v1::OptimizerKind> {};

// An ensemble of E trains member e exactly as a one-member run with the same
// seed: same losses at every step (to 1e-6) and the same final weights.
TEST_P(EnsembleTest, EachMemberTrainsAsItsOwnRun) {
  const v1::ExperimentSpec spec = SmallSpec(GetParam());
  const std::vector<uint64_t> seeds = {11, 12, 13};
  EnsembleTrainer ensemble(spec, seeds, torch::kCPU);
  std::vector<std::unique_ptr<EnsembleTrainer>> singles;
  for (uint64_t s : seeds) singles.push_back(std::make_unique<EnsembleTrainer>(spec, std::vector<uint64_t>{s}, torch::kCPU));

  for (int step = 1; step <= 20; ++step) {
    auto joint = ensemble.Step(/*record=*/true);
    for (size_t e = 0; e < seeds.size(); ++e) {
      auto own = singles[e]->Step(true);
      EXPECT_NEAR(ValueOf(joint[e], "train/loss"), ValueOf(own[0], "train/loss"), 1e-6) << "member " << e << " step " << step;
      EXPECT_NEAR(ValueOf(joint[e], "train/grad_norm"), ValueOf(own[0], "train/grad_norm"), 1e-5);
    }
  }
  auto joint_eval = ensemble.Evaluate();
  for (size_t e = 0; e < seeds.size(); ++e) {
    auto own_eval = singles[e]->Evaluate();
    EXPECT_NEAR(ValueOf(joint_eval[e], "eval/icl_rare/loss"), ValueOf(own_eval[0], "eval/icl_rare/loss"), 1e-6);
    const auto jp = ensemble.model().parameters();
    const auto op = singles[e]->model().parameters();
    for (size_t i = 0; i < jp.size(); ++i) {
      EXPECT_TRUE(torch::allclose(jp[i][e], op[i][0], 1e-5, 1e-6)) << "parameter " << i << " member " << e;
    }
  }
  // Members really differ from each other (different seeds).
  EXPECT_NE(ValueOf(joint_eval[0], "eval/icl_rare/loss"), ValueOf(joint_eval[1], "eval/icl_rare/loss"));
}

// A member's own checkpoint (with its slice of the optimizer state) resumes
// as a one-member run that continues the member's trajectory.
TEST_P(EnsembleTest, MemberCheckpointResumesAsItsOwnRun) {
  const v1::ExperimentSpec spec = SmallSpec(GetParam());
  const std::vector<uint64_t> seeds = {11, 12, 13};
  EnsembleTrainer ensemble(spec, seeds, torch::kCPU);
  for (int step = 1; step <= 7; ++step) ensemble.Step(false);
  EnsembleTrainer single(spec, {12}, torch::kCPU);
  ASSERT_TRUE(single.LoadCheckpoint(ensemble.SaveMemberCheckpoint(1)).ok());
  EXPECT_EQ(single.step(), 7);
  // Another member's checkpoint does not fit this seed.
  EXPECT_FALSE(single.LoadCheckpoint(ensemble.SaveMemberCheckpoint(0)).ok());
  ASSERT_TRUE(single.LoadCheckpoint(ensemble.SaveMemberCheckpoint(1)).ok());
  for (int step = 8; step <= 12; ++step) {
    auto joint = ensemble.Step(true);
    auto own = single.Step(true);
    EXPECT_NEAR(ValueOf(joint[1], "train/loss"), ValueOf(own[0], "train/loss"), 1e-6) << "step " << step;
  }
  const auto jp = ensemble.model().parameters();
  const auto op = single.model().parameters();
  for (size_t i = 0; i < jp.size(); ++i) EXPECT_TRUE(torch::allclose(jp[i][1], op[i][0], 1e-5, 1e-6)) << i;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EnsembleTest,
                         ::testing::Values(v1::OPTIMIZER_KIND_SGD, v1::OPTIMIZER_KIND_ADAM));

class ResumeTest : public ::testing::TestWithParam<v1::OptimizerKind> {};

// A checkpoint holds everything needed to continue bit-for-bit on CPU.
TEST_P(ResumeTest, ResumedTrainingIsBitIdentical) {
  const v1::ExperimentSpec spec = SmallSpec(GetParam(), 30);
  EnsembleTrainer straight(spec, {5}, torch::kCPU);
  std::vector<double> straight_losses;
  for (int i = 0; i < 30; ++i) straight_losses.push_back(ValueOf(straight.Step(true)[0], "train/loss"));

  std::string ckpt;
  {
    EnsembleTrainer first(spec, {5}, torch::kCPU);
    for (int i = 0; i < 15; ++i) first.Step(false);
    ckpt = first.SaveCheckpoint();
  }
  EnsembleTrainer resumed(spec, {5}, torch::kCPU);
  ASSERT_TRUE(resumed.LoadCheckpoint(ckpt).ok());
  EXPECT_EQ(resumed.step(), 15);
  for (int i = 15; i < 30; ++i) {
    EXPECT_EQ(ValueOf(resumed.Step(true)[0], "train/loss"), straight_losses[i]) << "step " << i + 1;
  }
  const auto a = straight.model().parameters(), b = resumed.model().parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ResumeTest, ::testing::Values(v1::OPTIMIZER_KIND_SGD, v1::OPTIMIZER_KIND_ADAM));

// What SubmitRun checks training.stop_metric against covers what the trainer
// records, on tasks with conflict sets, alternative answers and Bayes floors.
// The prefetcher hands out make(step) whatever the order of the steps asked
// (in order: the drawn-ahead batch; a rewind or jump: drawn anew), draws each
// in-order step once, stops drawing after `last`, and an exception of make()
// reaches the Take that wanted that batch, not an earlier one.
TEST(BatchPrefetcherTest, HandsOutEachStepsBatchAndRethrowsItsFailure) {
  std::mutex mu;
  std::vector<int64_t> drawn;
  BatchPrefetcher<int64_t> batches([&](int64_t step) {
    {
      std::lock_guard<std::mutex> lock(mu);
      drawn.push_back(step);
    }
    if (step == 7) throw std::runtime_error("no batch 7");
    return step * 10;
  });
  for (int64_t s = 1; s <= 4; ++s) EXPECT_EQ(batches.Take(s, 4), s * 10);
  EXPECT_EQ(batches.Take(2, 6), 20);  // a rewind (resume from a checkpoint)
  EXPECT_EQ(batches.Take(5, 6), 50);  // a jump: 3 was drawn ahead, then thrown away
  EXPECT_EQ(batches.Take(6, 6), 60);  // the last: nothing drawn after it
  EXPECT_EQ(batches.Take(6, 8), 60);  // draws 7 ahead, which fails
  EXPECT_THROW(batches.Take(7, 8), std::runtime_error);
  EXPECT_EQ(batches.Take(8, 8), 80);
  std::lock_guard<std::mutex> lock(mu);
  std::sort(drawn.begin(), drawn.end());  // 5 (asked) and 6 (ahead) are drawn at once
  EXPECT_EQ(drawn, (std::vector<int64_t>{1, 2, 2, 3, 3, 4, 5, 6, 6, 7, 8}));
}

// waited_seconds counts what the step waits for: an inline draw fully, a
// draw finished while the caller was busy not at all.
TEST(BatchPrefetcherTest, CountsOnlyTheTimeTheCallerWaits) {
  BatchPrefetcher<int64_t> batches([](int64_t step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return step;
  });
  EXPECT_EQ(batches.Take(1, 3), 1);  // drawn inline: the caller waits the whole draw
  const double inline_wait = batches.waited_seconds();
  EXPECT_GE(inline_wait, 0.025);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // "the step": step 2 is drawn meanwhile
  EXPECT_EQ(batches.Take(2, 3), 2);
  EXPECT_LT(batches.waited_seconds() - inline_wait, 0.02);
}

TEST(EvalMetricNamesTest, CoverWhatTheTrainerRecords) {
  for (const v1::ExperimentSpec& spec :
       {SmallSpec(v1::OPTIMIZER_KIND_SGD), testing::ResolvedSpec(R"({"task": {"ngram": {}},
          "recording": {"eval_size": 32}})"),
        testing::ResolvedSpec(R"({"task": {"k_hop": {}}, "recording": {"eval_size": 32}})")}) {
    EnsembleTrainer trainer(spec, {spec.seed()}, torch::kCPU);
    testing::ExpectEvalMetricsListed(spec, trainer.Evaluate()[0]);
  }
}

TEST(CheckpointTest, ACheckpointOfAnotherSpecIsRefused) {
  EnsembleTrainer a(SmallSpec(v1::OPTIMIZER_KIND_SGD), {1}, torch::kCPU);
  a.Step(false);
  EnsembleTrainer other_seed(SmallSpec(v1::OPTIMIZER_KIND_SGD), {2}, torch::kCPU);
  EXPECT_EQ(other_seed.LoadCheckpoint(a.SaveCheckpoint()).code(), absl::StatusCode::kInvalidArgument);
  v1::ExperimentSpec lr = SmallSpec(v1::OPTIMIZER_KIND_SGD);
  lr.mutable_training()->set_learning_rate(1.0);
  EnsembleTrainer other_lr(lr, {1}, torch::kCPU);
  EXPECT_EQ(other_lr.LoadCheckpoint(a.SaveCheckpoint()).code(), absl::StatusCode::kInvalidArgument);
}

// Records what the executor reports.
class Recorder : public TrainObserver {
 public:
  void OnMetrics(int64_t step, const std::vector<Metric>& m) override { metrics[step] = m; }
  void OnProgress(int64_t step, double) override { last_progress = step; }
  absl::Status OnCheckpoint(int64_t step, const std::string& bytes) override {
    checkpoints[step] = bytes;
    if (cancel_at_checkpoint != nullptr) cancel_at_checkpoint->Request(reason);
    return absl::OkStatus();
  }
  void OnCoordinates(int64_t step, Selection selection, const std::vector<double>& values) override {
    if (selection == Selection::kPaper) coordinates[step] = values;
  }
  std::map<int64_t, std::vector<Metric>> metrics;
  std::map<int64_t, std::string> checkpoints;
  std::map<int64_t, std::vector<double>> coordinates;  // paper basis
  int64_t last_progress = 0;
  CancelToken* cancel_at_checkpoint = nullptr;
  StopReason reason = StopReason::kCancel;
};

TEST(ExecutorTest, RecordsOnScheduleAndHonoursCancelAndPreempt) {
  auto exec = MakeTorchExecutor();
  TrainRequest req;
  req.spec = SmallSpec(v1::OPTIMIZER_KIND_SGD, 20);
  req.spec.mutable_recording()->set_metrics_every(5);
  req.spec.mutable_recording()->set_eval_every(10);
  req.spec.mutable_recording()->set_checkpoint_every(8);
  Recorder rec;
  auto out = exec->Train(req, rec);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->end, TrainEnd::kCompleted);
  EXPECT_EQ(out->last_step, 20);
  // Step 0 (initial evaluation), every 5th step, and the last.
  std::vector<int64_t> steps;
  for (const auto& [s, m] : rec.metrics) steps.push_back(s);
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 5, 10, 15, 20}));
  EXPECT_FALSE(std::isnan(ValueOf(rec.metrics[10], "eval/icl_rare/accuracy")));
  EXPECT_FALSE(std::isnan(ValueOf(rec.metrics[20], "eval/conflict/logit_diff")));
  EXPECT_EQ(rec.checkpoints.size(), 3u);  // 8, 16, 20
  EXPECT_TRUE(rec.checkpoints.count(20));
  EXPECT_EQ(rec.last_progress, 20);

  // Preempted at the first checkpoint: stops right there, checkpoint in hand.
  CancelToken preempt;
  Recorder stop;
  stop.cancel_at_checkpoint = &preempt;
  stop.reason = StopReason::kPreempt;
  req.cancel = &preempt;
  out = exec->Train(req, stop);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->end, TrainEnd::kPreempted);
  EXPECT_EQ(out->last_step, 8);

  // Resuming from it finishes the run with the uninterrupted run's numbers.
  TrainRequest resume = req;
  CancelToken none;
  resume.cancel = &none;
  resume.resume_from = stop.checkpoints.at(8);
  Recorder rest;
  out = exec->Train(resume, rest);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->end, TrainEnd::kCompleted);
  EXPECT_EQ(rest.metrics.count(0), 0u);  // no fresh initial evaluation on resume
  EXPECT_EQ(ValueOf(rest.metrics[20], "train/loss"), ValueOf(rec.metrics[20], "train/loss"));
  for (const Metric& m : rec.metrics[20]) EXPECT_EQ(ValueOf(rest.metrics[20], m.name), m.value) << m.name;

  // Cancelled: stops without a final checkpoint.
  CancelToken cancel;
  cancel.Request(StopReason::kCancel);
  req.cancel = &cancel;
  Recorder cancelled;
  out = exec->Train(req, cancelled);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->end, TrainEnd::kCancelled);
  EXPECT_TRUE(cancelled.checkpoints.empty());
}

// Packed members are projected on their own task's bases: associative recall
// draws its common pairs (the basis' C relation) from the seed, so member 1's
// coordinates are those it records alone, not its weights on member 0's basis.
TEST(ExecutorTest, PackedMembersRecordCoordinatesOnTheirOwnBasis) {
  auto exec = MakeTorchExecutor();
  std::vector<TrainRequest> requests(2);
  for (uint64_t e = 0; e < 2; ++e) {
    requests[e].spec = SmallSpec(v1::OPTIMIZER_KIND_SGD, 10);
    requests[e].spec.mutable_recording()->set_coordinates_every(5);
    requests[e].spec.set_seed(11 + e);
  }
  Recorder packed0, packed1, alone;
  const auto outcomes = exec->TrainPack(requests, {&packed0, &packed1});
  ASSERT_EQ(outcomes.size(), 2u);
  for (const auto& o : outcomes) ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(exec->Train(requests[1], alone).ok());
  ASSERT_EQ(packed1.coordinates.size(), 3u);  // steps 0, 5, 10
  for (const auto& [step, values] : alone.coordinates) {
    const std::vector<double>& got = packed1.coordinates.at(step);
    ASSERT_EQ(got.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_NEAR(got[i], values[i], 1e-5) << "step " << step << " coordinate " << i;
    }
  }
}

TEST(ExecutorTest, LibTorchFailuresBecomeStatuses) {
  auto exec = MakeTorchExecutor();
  TrainRequest req;
  req.spec = SmallSpec(v1::OPTIMIZER_KIND_SGD, 5);
  req.resume_from = "definitely not a checkpoint";
  Recorder rec;
  auto out = exec->Train(req, rec);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
  EXPECT_NE(out.status().message().find("could not be read by LibTorch"), std::string::npos) << out.status();
  req.resume_from.reset();
  req.device = "cuda:3";
  out = exec->Train(req, rec);
  EXPECT_FALSE(out.ok());
}

}  // namespace
}  // namespace circuitlab::engine
