#include "server/engine/tasks/assoc_recall.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>

#include "server/engine/torch_util.h"

namespace circuitlab::engine {
namespace {

AssocRecallConfig RecallConfig() {
  AssocRecallConfig c;
  c.num_common = 16;
  c.num_rare = 40;
  c.num_heldout = 8;
  c.num_blocks = 6;
  c.block_length = 2;
  c.num_positions = 32;
  c.rare_fraction = 0.3;
  c.variability = 0.4;
  return c;
}

// Per-sequence checks shared by several tests: BOS first, fillers outside
// blocks, the query key in exactly `copies` blocks, each holding the answer,
// and every other token in at most one block (the answer is unique).
void CheckStructure(const AssocRecallTask& task, const Batch& b, int64_t copies) {
  const auto& cfg = task.config();
  const int64_t B = b.tokens.size(0), T = b.tokens.size(1), k = cfg.block_length;
  auto tok = b.tokens.accessor<int64_t, 2>();
  auto blk = b.block_of_token.accessor<int64_t, 2>();
  auto tgt = b.target.accessor<int64_t, 1>();
  for (int64_t i = 0; i < B; ++i) {
    ASSERT_EQ(tok[i][0], kFill) << "sequence must start with BOS";
    const int64_t key = tok[i][T - k + 1];
    // Every non-filler context token sits in a block; count token uses.
    std::map<int64_t, int> count;
    int64_t key_hits = 0;
    for (int64_t t = 0; t < T - (k - 1); ++t) {
      if (blk[i][t] < 0) {
        ASSERT_EQ(tok[i][t], kFill);
        continue;
      }
      if (tok[i][t] != kFill) count[tok[i][t]]++;
      if (tok[i][t] == key) {
        ++key_hits;
        // The value sits k-1 after the key, inside the same block.
        ASSERT_EQ(blk[i][t + k - 1], blk[i][t]);
        ASSERT_EQ(tok[i][t + k - 1], tgt[i]) << "the key's block must hold the answer";
      }
    }
    ASSERT_EQ(key_hits, copies) << "burst count must be exact";
    for (const auto& [token, n] : count) {
      if (token == key || token == tgt[i]) {
        ASSERT_EQ(n, copies);
      } else {
        ASSERT_EQ(n, 1) << "token " << token << " appears in two blocks: the answer would not be unique";
      }
    }
  }
}

TEST(AssocRecallTest, QueryKindFrequenciesMatchRareFractionAndVariability) {
  AssocRecallTask task(RecallConfig(), 11);
  auto gen = MakeGenerator(1);
  Batch b = task.Sample(40000, SampleMode::kTrain, gen);
  const double rare = (b.query_kind == kQueryRare).to(torch::kDouble).mean().item<double>();
  const double varied = (b.query_kind == kQueryCommonVaried).to(torch::kDouble).mean().item<double>();
  // 5 standard errors at n = 40000.
  EXPECT_NEAR(rare, 0.3, 5 * std::sqrt(0.3 * 0.7 / 40000));
  EXPECT_NEAR(varied, 0.7 * 0.4, 5 * std::sqrt(0.28 * 0.72 / 40000));
  // phi = f_r + (1 - f_r) f_v: the share of queries weights alone cannot answer.
  EXPECT_NEAR(rare + varied, 0.3 + 0.7 * 0.4, 0.01);
}

TEST(AssocRecallTest, RepairModeRepairsWithARareAnswer) {
  AssocRecallTask task(RecallConfig(), 11);
  auto gen = MakeGenerator(2);
  Batch b = task.Sample(4000, SampleMode::kTrain, gen);
  const int64_t T = b.tokens.size(1);
  torch::Tensor key = b.tokens.select(1, T - 1);
  torch::Tensor varied = b.query_kind == kQueryCommonVaried;
  torch::Tensor canon = b.query_kind == kQueryCommonCanon;
  // Varied: common key, rare target; canonical: target = C(key).
  EXPECT_TRUE((key.masked_select(varied) < task.rare_begin()).all().item<bool>());
  EXPECT_TRUE((b.target.masked_select(varied) >= task.rare_begin()).all().item<bool>());
  EXPECT_TRUE(torch::equal(b.target.masked_select(canon), task.partner().index({key.masked_select(canon)})));
  CheckStructure(task, b, 1);
}

TEST(AssocRecallTest, VariantModeShowsTheClassThroughARareToken) {
  AssocRecallConfig cfg = RecallConfig();
  cfg.variant_mode = true;
  AssocRecallTask task(cfg, 11);
  auto gen = MakeGenerator(3);
  Batch b = task.Sample(4000, SampleMode::kTrain, gen);
  const int64_t T = b.tokens.size(1);
  torch::Tensor key = b.tokens.select(1, T - 1);
  torch::Tensor varied = b.query_kind == kQueryCommonVaried;
  EXPECT_GT(varied.sum().item<int64_t>(), 0);
  EXPECT_TRUE((key.masked_select(varied) >= task.rare_begin()).all().item<bool>());
  torch::Tensor t = b.target.masked_select(varied);
  EXPECT_TRUE(((t >= kNumSpecials) & (t < task.rare_begin())).all().item<bool>()) << "target stays the common partner";
  CheckStructure(task, b, 1);
}

TEST(AssocRecallTest, BurstinessPlacesExactlyBCopies) {
  for (int64_t burst : {1, 3, 6}) {
    AssocRecallConfig cfg = RecallConfig();
    cfg.burstiness = burst;
    cfg.max_gap = 2;
    AssocRecallTask task(cfg, 5);
    auto gen = MakeGenerator(4);
    Batch b = task.Sample(2000, SampleMode::kTrain, gen);
    CheckStructure(task, b, burst);
  }
}

TEST(AssocRecallTest, EvaluationSetsHaveTheirDefiningProperties) {
  AssocRecallTask task(RecallConfig(), 11);
  auto gen = MakeGenerator(5);
  const int64_t T = task.seq_len();

  Batch rare = task.Sample(1000, SampleMode::kIclRare, gen);
  EXPECT_TRUE((rare.query_kind == kQueryRare).all().item<bool>());
  CheckStructure(task, rare, 1);
  // icl_rare contexts hold rare tokens only (f_r = 1 for distractors too).
  torch::Tensor ctx = rare.tokens.narrow(1, 0, T - 1);
  EXPECT_FALSE(((ctx >= kNumSpecials) & (ctx < task.rare_begin())).any().item<bool>());

  Batch hold = task.Sample(1000, SampleMode::kIclHoldout, gen);
  torch::Tensor hkey = hold.tokens.select(1, T - 1);
  EXPECT_TRUE((hkey >= task.heldout_begin()).all().item<bool>());
  EXPECT_TRUE((hold.target >= task.heldout_begin()).all().item<bool>());
  // Held-out tokens appear only in the query's own block.
  EXPECT_EQ((hold.tokens >= task.heldout_begin()).sum().item<int64_t>(), 1000 * 3);
  CheckStructure(task, hold, 1);

  Batch iwl = task.Sample(1000, SampleMode::kIwl, gen);
  torch::Tensor ikey = iwl.tokens.select(1, T - 1);
  EXPECT_TRUE(torch::equal(iwl.target, task.partner().index({ikey})));
  CheckStructure(task, iwl, 0);  // the query pair is absent from the context

  Batch conflict = task.Sample(1000, SampleMode::kConflict, gen);
  torch::Tensor ckey = conflict.tokens.select(1, T - 1);
  EXPECT_TRUE(torch::equal(conflict.alt_target, task.partner().index({ckey})));
  EXPECT_TRUE((conflict.target != conflict.alt_target).all().item<bool>());
  EXPECT_TRUE(((conflict.target >= kNumSpecials) & (conflict.target < task.rare_begin())).all().item<bool>());
  // C(a) never appears in the context.
  torch::Tensor in_ctx = (conflict.tokens.narrow(1, 0, T - 1) == conflict.alt_target.unsqueeze(1)).any(1);
  EXPECT_FALSE(in_ctx.any().item<bool>());
  CheckStructure(task, conflict, 1);
}

TEST(AssocRecallTest, PositionIdsFollowTheBlockOffsetRule) {
  AssocRecallConfig cfg = RecallConfig();
  cfg.block_length = 3;
  cfg.max_gap = 1;
  AssocRecallTask task(cfg, 9);
  auto gen = MakeGenerator(6);
  Batch b = task.Sample(500, SampleMode::kTrain, gen);
  auto blk = b.block_of_token.accessor<int64_t, 2>();
  auto pid = b.pids.accessor<int64_t, 2>();
  auto tok = b.tokens.accessor<int64_t, 2>();
  const int64_t P = cfg.num_positions, T = task.seq_len();
  for (int64_t i = 0; i < 500; ++i) {
    for (int64_t t = 1; t < T; ++t) {
      ASSERT_GE(pid[i][t], 0);
      ASSERT_LT(pid[i][t], P);
      if (blk[i][t] >= 0 && blk[i][t] == blk[i][t - 1]) {
        ASSERT_EQ(pid[i][t], (pid[i][t - 1] + 1) % P) << "consecutive ids within a block";
      }
    }
    // Blocks are [key, FILL, value]: the middle token is a filler.
    for (int64_t t = 1; t + 1 < T; ++t) {
      if (blk[i][t - 1] >= 0 && blk[i][t - 1] == blk[i][t] && blk[i][t] == blk[i][t + 1]) {
        ASSERT_EQ(tok[i][t], kFill);
      }
    }
  }
  cfg.absolute_positions = true;
  AssocRecallTask abs_task(cfg, 9);
  Batch a = abs_task.Sample(4, SampleMode::kTrain, gen);
  EXPECT_TRUE(torch::equal(a.pids[0], torch::arange(abs_task.seq_len())));
  EXPECT_EQ(abs_task.num_positions(), abs_task.seq_len());
}

TEST(AssocRecallTest, ZipfExponentShapesPairFrequencies) {
  AssocRecallConfig cfg = RecallConfig();
  cfg.rare_fraction = 0.0;
  cfg.variability = 0.0;
  cfg.zipf_exponent = 1.0;
  AssocRecallTask task(cfg, 3);
  auto gen = MakeGenerator(7);
  Batch b = task.Sample(60000, SampleMode::kTrain, gen);
  torch::Tensor key = b.tokens.select(1, task.seq_len() - 1);
  // Pair index of each query, counted.
  std::vector<int64_t> per_pair(8, 0);
  auto pairs = task.pairs().accessor<int64_t, 2>();
  auto k = key.accessor<int64_t, 1>();
  for (int64_t i = 0; i < key.size(0); ++i) {
    for (int p = 0; p < 8; ++p) {
      if (pairs[p][0] == k[i] || pairs[p][1] == k[i]) per_pair[p]++;
    }
  }
  std::sort(per_pair.rbegin(), per_pair.rend());
  // P(rank r) ~ 1/r: the top pair is about twice the second and 8x the last.
  EXPECT_NEAR(static_cast<double>(per_pair[0]) / per_pair[1], 2.0, 0.1);
  EXPECT_NEAR(static_cast<double>(per_pair[0]) / per_pair[7], 8.0, 0.6);
}

TEST(AssocRecallTest, DeterministicGivenTheGeneratorSeed) {
  AssocRecallTask a(RecallConfig(), 42), b(RecallConfig(), 42), other_pool(RecallConfig(), 43);
  EXPECT_TRUE(torch::equal(a.pairs(), b.pairs()));
  EXPECT_FALSE(torch::equal(a.pairs(), other_pool.pairs()));
  auto g1 = MakeGenerator(9), g2 = MakeGenerator(9), g3 = MakeGenerator(10);
  Batch x = a.Sample(64, SampleMode::kTrain, g1);
  Batch y = b.Sample(64, SampleMode::kTrain, g2);
  Batch z = a.Sample(64, SampleMode::kTrain, g3);
  EXPECT_TRUE(torch::equal(x.tokens, y.tokens));
  EXPECT_TRUE(torch::equal(x.pids, y.pids));
  EXPECT_TRUE(torch::equal(x.target, y.target));
  EXPECT_FALSE(torch::equal(x.tokens, z.tokens));
}

TEST(AssocRecallTest, TooFewUnusedCommonPairsFallBackToRareDistractors) {
  AssocRecallConfig cfg = RecallConfig();
  cfg.num_common = 4;  // two pairs: at most one can be a distractor
  cfg.rare_fraction = 0.0;
  AssocRecallTask task(cfg, 1);
  auto gen = MakeGenerator(11);
  Batch b = task.Sample(500, SampleMode::kTrain, gen);
  CheckStructure(task, b, 1);
}

}  // namespace
}  // namespace circuitlab::engine
