#include "server/engine/models/imir_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>

#include "server/engine/tasks/assoc_recall.h"
#include "server/engine/torch_util.h"

namespace circuitlab::engine {
namespace {

AssocRecallConfig RareOnly() {
  AssocRecallConfig c;
  c.num_common = 0;
  c.num_rare = 24;
  c.num_heldout = 8;
  c.num_blocks = 6;
  c.num_positions = 16;
  c.rare_fraction = 1.0;
  return c;
}

TEST(ImirModelTest, WidthsFollowTheBlockResidual) {
  ImirModelConfig cfg = DenseConfig(/*vocab=*/10, /*positions=*/6, /*layers=*/3, /*heads=*/2);
  ImirModel model(cfg, 2, torch::kCPU);
  EXPECT_EQ(model.d0(), 16);
  EXPECT_EQ(model.width(1), 48);
  EXPECT_EQ(model.width(3), 16 * 27);
  EXPECT_EQ(model.kq(2).sizes(), (std::vector<int64_t>{2, 2, 144, 144}));
  EXPECT_EQ(model.readout().sizes(), (std::vector<int64_t>{2, 10, 432}));
}

TEST(ImirModelTest, CausalChangingALaterTokenNeverChangesAnEarlierOutput) {
  AssocRecallTask task(RareOnly(), 1);
  ImirModelConfig cfg = DenseConfig(task.vocab_size(), task.num_positions(), 2, 2, false, 0.5);
  ImirModel model(cfg, 1, torch::kCPU);
  model.Initialize({3});
  auto gen = MakeGenerator(2);
  Batch b = task.Sample(8, SampleMode::kTrain, gen);
  torch::NoGradGuard no_grad;
  torch::Tensor tok = b.tokens.unsqueeze(0), pid = b.pids.unsqueeze(0);
  torch::Tensor before = model.Forward(tok, pid, /*all_positions=*/true);
  const int64_t T = tok.size(2);
  for (int64_t t : {int64_t{3}, T / 2, T - 1}) {
    torch::Tensor tok2 = tok.clone(), pid2 = pid.clone();
    tok2.select(2, t).fill_(task.rare_begin() + 1);
    pid2.select(2, t).fill_(5);
    torch::Tensor after = model.Forward(tok2, pid2, true);
    EXPECT_TRUE(torch::equal(before.narrow(2, 0, t), after.narrow(2, 0, t))) << "position " << t;
    EXPECT_FALSE(torch::allclose(before.select(2, t), after.select(2, t))) << "position " << t;
  }
  // The last-position fast path equals the full forward at the last position.
  torch::Tensor last = model.Forward(tok, pid);
  EXPECT_TRUE(torch::allclose(last, before.select(2, T - 1), 1e-5, 1e-6));
}

TEST(ImirModelTest, HookPointsInOrderAndEditsTakeEffect) {
  AssocRecallTask task(RareOnly(), 1);
  ImirModel model(DenseConfig(task.vocab_size(), task.num_positions(), 2, 2, false, 0.5), 1, torch::kCPU);
  model.Initialize({4});
  auto gen = MakeGenerator(5);
  Batch b = task.Sample(6, SampleMode::kTrain, gen);
  torch::NoGradGuard no_grad;
  torch::Tensor tok = b.tokens.unsqueeze(0), pid = b.pids.unsqueeze(0);
  const int64_t T = tok.size(2), d0 = model.d0();
  std::vector<std::string> seen;
  std::map<std::string, std::vector<int64_t>> shapes;
  HookFn watch = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
    seen.push_back(point);
    shapes[point] = v.sizes().vec();
    return {};
  };
  torch::Tensor watched = model.Forward(tok, pid, false, nullptr, &watch);
  EXPECT_TRUE(torch::allclose(watched, model.Forward(tok, pid), 1e-5, 1e-6));  // a hook that edits nothing
  const std::vector<std::string> expect = {"embed", "L1.attn", "L1.H1.out", "L1.H2.out", "L1.resid",
                                           "L2.attn", "L2.H1.out", "L2.H2.out", "L2.resid", "logits"};
  EXPECT_EQ(seen, expect);
  EXPECT_EQ(shapes["L1.attn"], (std::vector<int64_t>{1, 2, 6, T, T}));
  EXPECT_EQ(shapes["L2.H1.out"], (std::vector<int64_t>{1, 6, T, 3 * d0}));
  EXPECT_EQ(shapes["L2.resid"], (std::vector<int64_t>{1, 6, T, 9 * d0}));
  // Zeroing a head's output at its last layer is ablating that head at the query.
  HookFn zero = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
    return point == "L2.H2.out" ? torch::zeros_like(v) : torch::Tensor();
  };
  torch::Tensor zeroed = model.Forward(tok, pid, false, nullptr, &zero);
  ImirModel ablated(model.config(), 1, torch::kCPU);
  for (int64_t l = 0; l < 2; ++l) ablated.kq(l).copy_(model.kq(l));
  ablated.readout().copy_(model.readout());
  ablated.readout().narrow(2, 6 * d0, 3 * d0).zero_();  // the readout of L2's head-2 block
  EXPECT_TRUE(torch::allclose(zeroed, ablated.Forward(tok, pid), 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(zeroed, watched, 1e-3, 1e-3));
}

// The canonical induction head of SCIENCE.md C.5 built by hand: alpha on
// B_1(0, 0, S_1), beta on B_2(0, (1,0), I_t), gamma on OUT((0,1), I). If the
// block layout of the model is right, it solves in-context recall, held-out
// tokens included. Absolute ids make "one position back" exact (with block
// offsets other tokens can share the previous id and dilute alpha's head).
TEST(ImirModelTest, HandBuiltInductionHeadSolvesRecall) {
  AssocRecallConfig task_cfg = RareOnly();
  task_cfg.absolute_positions = true;
  AssocRecallTask task(task_cfg, 4);
  const int64_t V = task.vocab_size(), P = task.num_positions(), d0 = V + P;
  ImirModelConfig cfg = DenseConfig(V, P, 2, 1, /*zero_init=*/true);
  ImirModel model(cfg, 1, torch::kCPU);
  const double alpha = 30, beta = 30, gamma = 30;
  {
    torch::NoGradGuard no_grad;
    // Layer 1: query at pid u attends to the key at pid u-1 (S_1).
    auto w1 = model.kq(0)[0][0];
    for (int64_t u = 0; u < P; ++u) w1[V + u][V + (u - 1 + P) % P] = alpha;
    // Layer 2: the query's raw token (block 0) vs the key's previous token
    // (block (1,0), offset d0).
    auto w2 = model.kq(1)[0][0];
    for (int64_t v = 0; v < V; ++v) w2[v][d0 + v] = beta;
    // Output: read the token the layer-2 head copied from the raw stream
    // (block (0,1), offset 2 d0).
    auto out = model.readout()[0];
    for (int64_t v = 0; v < V; ++v) out[v][2 * d0 + v] = gamma;
  }
  auto gen = MakeGenerator(5);
  for (SampleMode mode : {SampleMode::kIclRare, SampleMode::kIclHoldout}) {
    Batch b = task.Sample(512, mode, gen);
    torch::NoGradGuard no_grad;
    torch::Tensor logits = model.Forward(b.tokens.unsqueeze(0), b.pids.unsqueeze(0))[0];
    const double acc = (logits.argmax(-1) == b.target).to(torch::kDouble).mean().item<double>();
    EXPECT_GE(acc, 0.99) << "mode " << static_cast<int>(mode);
  }
}

TEST(ImirModelTest, ZeroInitGivesUniformPredictions) {
  AssocRecallTask task(RareOnly(), 1);
  ImirModel model(DenseConfig(task.vocab_size(), task.num_positions(), 2, 1, true), 2, torch::kCPU);
  model.Initialize({1, 2});
  auto gen = MakeGenerator(1);
  Batch b = task.Sample(4, SampleMode::kTrain, gen);
  torch::Tensor tok = torch::stack({b.tokens, b.tokens}), pid = torch::stack({b.pids, b.pids});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model.Forward(tok, pid), torch::zeros({2, 4, task.vocab_size()})));
}

}  // namespace
}  // namespace circuitlab::engine
