// The block-list generators of SCIENCE.md A.1.2-A.1.7: every sequence has the
// structure its definition demands (checked by solving it the slow way), the
// evaluation sets and shapes match the catalogue, and every task's declared
// symmetry yields its basis.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <set>

#include "client/lib/client.h"
#include "tests/test_util/engine_util.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/block_task.h"

namespace circuitlab::engine {
namespace {

v1::ExperimentSpec Spec(const std::string& task_json) {
  return testing::ResolvedSpec(R"({"task": )" + task_json + "}");
}

Batch Draw(const BlockTask& task, int64_t n, uint64_t seed = 1) {
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch b = task.Sample(n, SampleMode::kTrain, gen);
  EXPECT_EQ(b.tokens.size(1), task.seq_len());
  EXPECT_LT(b.tokens.max().item<int64_t>(), task.vocab_size());
  EXPECT_LT(b.pids.max().item<int64_t>(), task.num_positions());
  EXPECT_GE(b.pids.min().item<int64_t>(), 0);
  EXPECT_TRUE((b.tokens.select(1, 0) == kFill).all().item<bool>()) << "every sequence starts with BOS";
  return b;
}

std::vector<int64_t> Row(const torch::Tensor& t, int64_t i) {
  torch::Tensor r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

TEST(TasksTest, KHopFollowsTheChain) {
  const v1::ExperimentSpec spec = Spec(R"({"k_hop": {"num_tokens": 20, "num_blocks": 5, "hops": 3}})");
  auto task = MakeBlockTask(spec, 1);
  const Batch b = Draw(*task, 200);
  ASSERT_EQ(task->EvalSets().at(0).alt_name, "shortcut");
  for (int64_t i = 0; i < 200; ++i) {
    const auto tok = Row(b.tokens, i);
    std::map<int64_t, int64_t> next;  // first -> second of each block
    for (int64_t j = 0; j < 5; ++j) {
      ASSERT_FALSE(next.count(tok[1 + 2 * j])) << "a token starts two blocks";
      next[tok[1 + 2 * j]] = tok[2 + 2 * j];
    }
    int64_t at = tok.back();
    for (int hop = 0; hop < 3; ++hop) at = next.at(at);
    EXPECT_EQ(at, b.target[i].item<int64_t>());
    EXPECT_EQ(next.at(tok.back()), b.alt_target[i].item<int64_t>());
  }
  // BLOCK_OFFSET: consecutive ids inside a block.
  const auto pid = Row(b.pids, 0);
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ((pid[1 + 2 * j] + 1) % 16, pid[2 + 2 * j]);
}

TEST(TasksTest, NGramBayesPredictorIsThePosteriorPredictive) {
  const v1::ExperimentSpec spec = Spec(R"({"ngram": {"alphabet": 3, "order": 3, "length": 20}})");
  auto task = MakeBlockTask(spec, 1);
  const Batch b = Draw(*task, 50);
  ASSERT_TRUE(b.bayes_logp.defined());
  for (int64_t i = 0; i < 50; ++i) {
    const auto tok = Row(b.tokens, i);
    std::vector<int64_t> s(tok.begin() + 1, tok.end());
    for (int64_t& x : s) {
      ASSERT_GE(x, kNumSpecials);
      ASSERT_LT(x, kNumSpecials + 3);
    }
    // Counts of (context of 2, next) inside the sequence, for the final context.
    const int64_t c0 = s[s.size() - 2], c1 = s.back();
    std::vector<double> count(3, 0.0);
    for (size_t j = 2; j < s.size(); ++j) {
      if (s[j - 2] == c0 && s[j - 1] == c1) count[s[j] - kNumSpecials] += 1;
    }
    const double total = count[0] + count[1] + count[2];
    for (int v = 0; v < 3; ++v) {
      EXPECT_NEAR(std::exp(b.bayes_logp[i][kNumSpecials + v].item<double>()), (count[v] + 1) / (total + 3), 1e-12);
    }
    EXPECT_GE(b.target[i].item<int64_t>(), kNumSpecials);
  }
}

TEST(TasksTest, IoiTargetIsTheOtherName) {
  const v1::ExperimentSpec spec = Spec(R"({"ioi": {"num_names": 10, "max_fillers": 3}})");
  auto task = MakeBlockTask(spec, 1);
  const Batch b = Draw(*task, 300);
  std::set<int64_t> starts;
  int subject_is_first = 0;
  for (int64_t i = 0; i < 300; ++i) {
    const auto tok = Row(b.tokens, i);
    std::vector<int64_t> names;
    for (size_t j = 0; j + 3 < tok.size(); ++j) {
      if (tok[j] >= kNumSpecials) {
        names.push_back(tok[j]);
        if (names.size() == 1) starts.insert(static_cast<int64_t>(j));
      }
    }
    ASSERT_EQ(names.size(), 2u);
    ASSERT_NE(names[0], names[1]);
    const int64_t T = task->seq_len();
    EXPECT_EQ(tok[T - 3], kSep);
    EXPECT_EQ(tok[T - 1], kGive);
    const int64_t subject = tok[T - 2];
    ASSERT_TRUE(subject == names[0] || subject == names[1]);
    subject_is_first += subject == names[0];
    EXPECT_EQ(b.target[i].item<int64_t>(), subject == names[0] ? names[1] : names[0]);
  }
  EXPECT_EQ(starts.size(), 4u) << "0..3 fillers move the names";
  EXPECT_NEAR(subject_is_first / 300.0, 0.5, 0.1);
}

TEST(TasksTest, ConditionalRetrievalAnswersTheTaggedKey) {
  const v1::ExperimentSpec spec =
      Spec(R"({"conditional_retrieval": {"num_tokens": 24, "num_tags": 4, "num_blocks": 6, "tags_per_key": 2}})");
  auto task = MakeBlockTask(spec, 1);
  const Batch b = Draw(*task, 200);
  for (int64_t i = 0; i < 200; ++i) {
    const auto tok = Row(b.tokens, i);
    std::map<int64_t, std::set<int64_t>> tags_of_key;
    std::map<std::pair<int64_t, int64_t>, int64_t> value;
    for (int64_t j = 0; j < 6; ++j) {
      const int64_t tag = tok[1 + 3 * j], key = tok[2 + 3 * j], v = tok[3 + 3 * j];
      ASSERT_GE(tag, kNumSpecials);
      ASSERT_LT(tag, kNumSpecials + 4);
      ASSERT_TRUE(tags_of_key[key].insert(tag).second) << "a key repeats a tag";
      value[{tag, key}] = v;
    }
    ASSERT_EQ(tags_of_key.size(), 3u);
    for (const auto& [key, tags] : tags_of_key) EXPECT_EQ(tags.size(), 2u);
    const int64_t T = task->seq_len();
    EXPECT_EQ(value.at({tok[T - 2], tok[T - 1]}), b.target[i].item<int64_t>());
  }
}

TEST(TasksTest, PermutationInversionAnswersThePreimage) {
  const v1::ExperimentSpec spec = Spec(R"({"permutation_inversion": {"num_tokens": 10, "num_blocks": 6}})");
  auto task = MakeBlockTask(spec, 1);
  const Batch b = Draw(*task, 300);
  int query_also_starts_a_block = 0;
  for (int64_t i = 0; i < 300; ++i) {
    const auto tok = Row(b.tokens, i);
    std::map<int64_t, int64_t> preimage;
    std::set<int64_t> firsts;
    for (int64_t j = 0; j < 6; ++j) {
      ASSERT_TRUE(firsts.insert(tok[1 + 2 * j]).second);
      ASSERT_TRUE(preimage.emplace(tok[2 + 2 * j], tok[1 + 2 * j]).second) << "pi is not injective";
    }
    EXPECT_EQ(preimage.at(tok.back()), b.target[i].item<int64_t>());
    query_also_starts_a_block += firsts.count(tok.back()) > 0;
  }
  EXPECT_GT(query_also_starts_a_block, 30) << "the forward match must be a real distractor";
  // The paper set declares the backward-in-block shift.
  const Basis paper = BuildBasis(task->Symmetry(), 2, 1, Selection::kPaper);
  EXPECT_GE(FindCoordinate(paper, "L1H1:[∅→∅]:S_-1"), 0);
}

TEST(TasksTest, MinimalIclHasNineteenPaperCoordinates) {
  const v1::ExperimentSpec spec = Spec(R"({"minimal_icl": {"num_pairs": 8}})");
  auto task = MakeBlockTask(spec, 1);
  EXPECT_EQ(task->seq_len(), 18);
  EXPECT_EQ(task->num_positions(), 18);
  EXPECT_EQ(task->vocab_size(), 4 + 32 + 32);
  const Batch b = Draw(*task, 200);
  for (int64_t i = 0; i < 200; ++i) {
    const auto tok = Row(b.tokens, i);
    std::set<int64_t> items, labels;
    for (int64_t j = 0; j < 8; ++j) {
      ASSERT_GE(tok[1 + 2 * j], 4);
      ASSERT_LT(tok[1 + 2 * j], 36);
      ASSERT_GE(tok[2 + 2 * j], 36);
      items.insert(tok[1 + 2 * j]);
      labels.insert(tok[2 + 2 * j]);
      if (tok[1 + 2 * j] == tok.back()) {
        EXPECT_EQ(tok[2 + 2 * j], b.target[i].item<int64_t>());
      }
    }
    EXPECT_EQ(items.size(), 8u);
    EXPECT_EQ(labels.size(), 8u);
    EXPECT_TRUE(items.count(tok.back()));
  }
  EXPECT_TRUE(torch::equal(b.pids[0], torch::arange(18, torch::kLong)));
  // SCIENCE.md E.1 on the task E.4 trains: 3 + 12 + 4 = 19, with the canonical names.
  const Basis paper = BuildBasis(task->Symmetry(), 2, 1, Selection::kPaper);
  EXPECT_EQ(paper.coords.size(), 19u);
  for (const char* name : {"alpha", "beta", "gamma"}) EXPECT_GE(FindCoordinate(paper, name), 0) << name;
  EXPECT_LT(FindCoordinate(paper, "delta"), 0);  // no fixed relation
}

// Every task: the generator's symmetry equals the catalogue's declaration
// (the one ResolveSpec checks coordinate names against), and the same seed
// gives the same batch.
TEST(TasksTest, DeclaredSymmetryAndDeterminism) {
  for (const char* json : {R"({"associative_recall": {}})", R"({"k_hop": {}})", R"({"ngram": {}})", R"({"ioi": {}})",
                           R"({"conditional_retrieval": {}})", R"({"permutation_inversion": {}})",
                           R"({"minimal_icl": {}})"}) {
    const v1::ExperimentSpec spec = Spec(json);
    auto task = MakeBlockTask(spec, 3);
    const TaskSymmetry declared = DeclaredSymmetry(spec), own = task->Symmetry();
    EXPECT_EQ(declared.token_class, own.token_class) << json;
    EXPECT_EQ(declared.paper_shifts, own.paper_shifts) << json;
    EXPECT_EQ(declared.positions, task->num_positions()) << json;
    EXPECT_EQ(ShapeOf(spec).seq_len, task->seq_len()) << json;
    EXPECT_EQ(ShapeOf(spec).vocab, task->vocab_size()) << json;
    const Batch a = Draw(*task, 16, 5), b = Draw(*task, 16, 5);
    EXPECT_TRUE(torch::equal(a.tokens, b.tokens)) << json;
    EXPECT_TRUE(torch::equal(a.target, b.target)) << json;
    EXPECT_FALSE(BuildBasis(own, 2, 1, Selection::kComplete).coords.empty());
  }
}

}  // namespace
}  // namespace circuitlab::engine
