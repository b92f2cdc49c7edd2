// The decoder's fused CPU kernels (server/engine/models/decoder_kernels.h)
// against the reference ATen ops: forward values and gradients in float32.
// Tolerances: 2e-6 absolute plus 2e-5 relative per element for one kernel
// (float rounding of a few dozen operations and the exp polynomial's
// ~2e-7); 1e-4 relative to the tensor's largest entry for a whole model,
// whose gradients pass through every block.
#include "server/engine/models/decoder_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <tuple>

#include "server/engine/models/decoder_model.h"
#include "server/engine/train/latent_trainer.h"

namespace circuitlab::engine {
namespace {

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const torch::Tensor err = (got - want).abs(), bound = atol + rtol * want.abs();
  EXPECT_TRUE((err <= bound).all().item<bool>())
      << what << ": max error " << err.max().item<double>() << " at index " << err.flatten().argmax().item<int64_t>()
      << " where the bound is " << bound.flatten()[err.flatten().argmax()].item<double>() << " (value "
      << want.flatten()[err.flatten().argmax()].item<double>() << ")";
}

// The autograd node names of the graph that produced `t` (the fused kernels'
// nodes carry their Function's type name).
std::string GraphNodeNames(const torch::Tensor& t) {
  std::string names;
  std::set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo = {t.grad_fn().get()};
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    names += n->name() + " ";
    for (const torch::autograd::Edge& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return names;
}

// Inputs with a spread that reaches the exp's clamp (|x| up to ~90) and
// widths that are not a multiple of the vector width.
torch::Tensor Spread(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn(shape) * 3;
  x.view(-1)[0] = 95.0;
  x.view(-1)[1] = -95.0;
  x.view(-1)[2] = 12.0;
  x.view(-1)[3] = -12.0;
  return x;
}

TEST(DecoderKernelsTest, BiasActivationMatchesAtenForwardAndBackward) {
  for (MlpActivation act : {MlpActivation::kSilu, MlpActivation::kGeluTanh}) {
    const std::string name = act == MlpActivation::kSilu ? "silu" : "gelu";
    torch::Tensor h = Spread({2, 3, 5, 37}, 1).requires_grad_(true);
    torch::Tensor b = (torch::randn({2, 37}) * 0.5).requires_grad_(true);
    torch::Tensor up = torch::randn({2, 3, 5, 37});
    torch::Tensor y = BiasActivation(h, b, act);
    auto g = torch::autograd::grad({(y * up).sum()}, {h, b});

    // The reference in double: ATen's float kernels round too (tanh-GELU's
    // derivative at |x| ~ 10 loses ~1e-6 to 1 - tanh^2 in float either way).
    torch::Tensor h2 = h.detach().to(torch::kDouble).requires_grad_(true),
                  b2 = b.detach().to(torch::kDouble).requires_grad_(true);
    torch::Tensor z = h2 + b2.view({2, 1, 1, 37});
    torch::Tensor ref = act == MlpActivation::kSilu ? torch::silu(z) : torch::gelu(z, "tanh");
    auto g2 = torch::autograd::grad({(ref * up.to(torch::kDouble)).sum()}, {h2, b2});
    ExpectClose(y.to(torch::kDouble), ref, 2e-6, 2e-5, name + " forward");
    ExpectClose(g[0].to(torch::kDouble), g2[0], 2e-6, 2e-5, name + " d h");
    ExpectClose(g[1].to(torch::kDouble), g2[1], 2e-5, 2e-5, name + " d bias");  // sums of 15 rows
    EXPECT_TRUE(torch::isfinite(g[0]).all().item<bool>()) << name;
  }
}

TEST(DecoderKernelsTest, MemberLayerNormMatchesAtenForwardAndBackward) {
  for (int64_t D : {64, 37}) {
    torch::Tensor x = (torch::randn({2, 4, 6, D}) * 2 + 0.5).requires_grad_(true);
    torch::Tensor w = (torch::randn({2, D}) + 1).requires_grad_(true), b = torch::randn({2, D}).requires_grad_(true);
    torch::Tensor up = torch::randn({2, 4, 6, D});
    torch::Tensor y = MemberLayerNorm(x, w, b);
    auto g = torch::autograd::grad({(y * up).sum()}, {x, w, b});

    torch::Tensor x2 = x.detach().clone().requires_grad_(true), w2 = w.detach().clone().requires_grad_(true),
                  b2 = b.detach().clone().requires_grad_(true);
    torch::Tensor ref = torch::layer_norm(x2, {D}, {}, {}, 1e-5) * w2.view({2, 1, 1, D}) + b2.view({2, 1, 1, D});
    auto g2 = torch::autograd::grad({(ref * up).sum()}, {x2, w2, b2});
    const std::string name = "D " + std::to_string(D);
    ExpectClose(y, ref, 2e-6, 2e-5, name + " forward");
    ExpectClose(g[0], g2[0], 1e-5, 2e-5, name + " d x");
    ExpectClose(g[1], g2[1], 2e-5, 2e-5, name + " d w");
    ExpectClose(g[2], g2[2], 2e-5, 2e-5, name + " d b");
  }
}

// The reference attention of DecoderModel: RoPE (half split), causal
// softmax, heads side by side.
torch::Tensor ReferenceAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& cos, const torch::Tensor& sin, int64_t H) {
  const int64_t E = q.size(0), B = q.size(1), T = q.size(2), D = q.size(3), dh = D / H, half = dh / 2;
  auto heads = [&](const torch::Tensor& x) { return x.view({E, B, T, H, dh}).permute({0, 1, 3, 2, 4}); };
  auto rope = [&](const torch::Tensor& x) {
    torch::Tensor c = cos.narrow(0, 0, T), s = sin.narrow(0, 0, T);
    torch::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
    return torch::cat({x1 * c - x2 * s, x1 * s + x2 * c}, -1);
  };
  torch::Tensor scores = torch::matmul(rope(heads(q)), rope(heads(k)).transpose(-1, -2)) / std::sqrt(double(dh));
  torch::Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);
  torch::Tensor p = torch::softmax(scores.masked_fill(mask, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(p, heads(v)).permute({0, 1, 3, 2, 4}).reshape({E, B, T, D});
}

TEST(DecoderKernelsTest, CausalAttentionMatchesTheReferenceForwardAndBackward) {
  for (auto [T, D, H] : {std::tuple<int64_t, int64_t, int64_t>{13, 12, 2}, {40, 128, 2}, {9, 48, 3}}) {
    const std::string name = "T " + std::to_string(T) + " D " + std::to_string(D) + " H " + std::to_string(H);
    torch::manual_seed(T * D);
    torch::Tensor q = (torch::randn({2, 3, T, D}) * 2).requires_grad_(true),
                  k = torch::randn({2, 3, T, D}).requires_grad_(true),
                  v = torch::randn({2, 3, T, D}).requires_grad_(true);
    const int64_t half = D / H / 2;
    torch::Tensor angle = torch::arange(T + 3, torch::kDouble).unsqueeze(1) *
                          torch::pow(10000.0, -torch::arange(half, torch::kDouble) / double(half)).unsqueeze(0);
    torch::Tensor cos = angle.cos().to(torch::kFloat),
                  sin = angle.sin().to(torch::kFloat);  // longer than T, as the model's
    torch::Tensor bias = (torch::randn({2, 3 * D}) * 0.3).requires_grad_(true);
    torch::Tensor up = torch::randn({2, 3, T, D});
    torch::Tensor y = CausalAttention(torch::cat({q, k, v}, 3), bias, cos, sin, H);
    auto g = torch::autograd::grad({(y * up).sum()}, {q, k, v, bias});
    // The reference in double, the bias added to q, k and v.
    std::vector<torch::Tensor> in;
    for (const torch::Tensor& t : {q, k, v, bias}) in.push_back(t.detach().to(torch::kDouble).requires_grad_(true));
    auto biased = [&](int i) { return in[i] + in[3].narrow(1, i * D, D).view({2, 1, 1, D}); };
    torch::Tensor ref =
        ReferenceAttention(biased(0), biased(1), biased(2), cos.to(torch::kDouble), sin.to(torch::kDouble), H);
    auto g2 = torch::autograd::grad({(ref * up.to(torch::kDouble)).sum()}, in);
    ExpectClose(y.to(torch::kDouble), ref, 1e-5, 1e-4, name + " forward");
    const char* names[] = {"q", "k", "v", "bias"};
    for (int i = 0; i < 4; ++i) {
      ExpectClose(g[i].to(torch::kDouble), g2[i], 1e-5 * g2[i].abs().max().item<double>(), 1e-4,
                  name + " d " + names[i]);
    }
    // Without a bias: the same as a zero bias.
    torch::Tensor y0 = CausalAttention(torch::cat({q, k, v}, 3), torch::Tensor(), cos, sin, H);
    torch::Tensor yz = CausalAttention(torch::cat({q, k, v}, 3), torch::zeros({2, 3 * D}), cos, sin, H);
    EXPECT_TRUE(torch::equal(y0, yz)) << name;
  }
}

TEST(DecoderKernelsTest, NextTokenCrossEntropyMatchesTheReference) {
  for (int64_t V : {6, 37}) {
    torch::manual_seed(V);
    torch::Tensor logits = (torch::randn({2, 3, 11, V}) * 3).requires_grad_(true);
    torch::Tensor tokens = torch::randint(0, V, {2, 3, 11}, torch::kLong);
    torch::Tensor up = torch::randn({2, 3});
    torch::Tensor loss = NextTokenCrossEntropy(logits, tokens);
    torch::Tensor g = torch::autograd::grad({(loss * up).sum()}, {logits})[0];
    torch::Tensor x = logits.detach().to(torch::kDouble).requires_grad_(true);
    torch::Tensor logp = torch::log_softmax(x.narrow(2, 0, 10), -1);
    torch::Tensor ref = -logp.gather(-1, tokens.narrow(2, 1, 10).unsqueeze(-1)).squeeze(-1).mean(-1);
    torch::Tensor g2 = torch::autograd::grad({(ref * up.to(torch::kDouble)).sum()}, {x})[0];
    const std::string name = "V " + std::to_string(V);
    ExpectClose(loss.to(torch::kDouble), ref, 2e-6, 2e-5, name + " loss");
    ExpectClose(g.to(torch::kDouble), g2, 2e-7, 2e-5, name + " d logits");
    EXPECT_TRUE(torch::all(g.select(2, 10) == 0).item<bool>()) << name << ": the last position has no next token";
  }
  EXPECT_THROW(NextTokenCrossEntropy(torch::zeros({1, 4, 3}), torch::full({1, 4}, 3, torch::kLong)), c10::Error);
  // The trainers' NextTokenLoss takes the kernel for float32 CPU logits and
  // the reference ops for float64, with the same values.
  torch::Tensor logits = torch::randn({2, 3, 11, 6}).requires_grad_(true);
  torch::Tensor tokens = torch::randint(0, 6, {2, 3, 11}, torch::kLong);
  torch::Tensor fused = NextTokenLoss(logits, tokens), ref = NextTokenLoss(logits.to(torch::kDouble), tokens);
  EXPECT_NE(GraphNodeNames(fused).find("NextTokenFn"), std::string::npos) << "float32: the kernel not taken";
  EXPECT_EQ(GraphNodeNames(ref).find("NextTokenFn"), std::string::npos) << "float64: the kernel taken";
  ExpectClose(fused.to(torch::kDouble), ref, 2e-6, 2e-5, "NextTokenLoss");
}

TEST(DecoderKernelsTest, ApplyOnlyToFloatOnTheCpu) {
  EXPECT_TRUE(FusedKernelsApply(torch::zeros({2}, torch::kFloat)));
  EXPECT_FALSE(FusedKernelsApply(torch::zeros({2}, torch::kDouble)));
  EXPECT_THROW(BiasActivation(torch::zeros({1, 2, 3}, torch::kDouble), torch::zeros({1, 3}, torch::kDouble),
                              MlpActivation::kSilu),
               c10::Error);
}

// The whole model: its forward without a hook (the fused kernels) against the
// same forward with a hook that changes nothing (the reference ops), for the
// token model (B.2: SiLU) and the regression model (B.3: GELU, attention
// biases, final LayerNorm).
TEST(DecoderKernelsTest, FusedForwardMatchesTheReferenceModel) {
  for (bool regression : {false, true}) {
    DecoderConfig cfg;
    cfg.vocab = regression ? 1 : 7;
    cfg.d_model = 32;
    cfg.heads = 2;
    cfg.mlp = 96;
    cfg.layers = 3;
    cfg.max_len = 12;
    if (regression) {
      cfg.input_dim = 5;
      cfg.gelu = cfg.attn_bias = cfg.final_ln = true;
    }
    DecoderModel model(cfg, 2, torch::kCPU);
    model.Initialize({11, 12});
    {  // non-zero biases and gains, so that their gradients are checked through the data
      torch::NoGradGuard no_grad;
      for (torch::Tensor& p : model.parameters()) p.add_(torch::randn(p.sizes()) * 0.05);
    }
    torch::manual_seed(3);
    torch::Tensor in = regression ? torch::randn({2, 4, 12, 5}) : torch::randint(0, 7, {2, 4, 12}, torch::kLong);
    const HookFn identity = [](const std::string&, const torch::Tensor&) { return torch::Tensor(); };
    torch::Tensor fast = model.Forward(in), ref = model.Forward(in, &identity);
    const std::string name = regression ? "regression" : "tokens";
    // Without a hook the model takes every fused kernel; with one, none.
    const std::string fast_nodes = GraphNodeNames(fast), ref_nodes = GraphNodeNames(ref);
    for (const char* kernel : {"CausalAttentionFn", "MemberLayerNormFn", "BiasActivationFn"}) {
      EXPECT_NE(fast_nodes.find(kernel), std::string::npos) << name << ": " << kernel << " not taken";
      EXPECT_EQ(ref_nodes.find(kernel), std::string::npos) << name << ": " << kernel << " taken under a hook";
    }
    ExpectClose(fast, ref, 1e-4 * ref.abs().max().item<double>(), 0, name + " outputs");
    torch::Tensor up = torch::randn(fast.sizes());
    // allow_unused: the regression model's pad is read by MapstoInputs only.
    auto g = torch::autograd::grad({(fast * up).sum()}, model.parameters(), {}, {}, false, true);
    auto g2 = torch::autograd::grad({(ref * up).sum()}, model.parameters(), {}, {}, false, true);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i].defined(), g2[i].defined()) << model.parameter_names()[i];
      if (!g[i].defined()) continue;
      ExpectClose(g[i], g2[i], 1e-4 * g2[i].abs().max().item<double>() + 1e-7, 0,
                  name + " d " + model.parameter_names()[i]);
    }
  }
}

}  // namespace
}  // namespace circuitlab::engine
