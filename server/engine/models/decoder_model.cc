#include "server/engine/models/decoder_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "server/common/thread_cancel.h"
#include "server/engine/families/spec/spec_family.h"
#include "server/engine/models/decoder_kernels.h"
#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {
namespace {

// A bias-free linear map per member: x [E, ..., in] times w [E, in, out].
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w) {
  const int64_t E = x.size(0);
  torch::Tensor flat = x.reshape({E, -1, x.size(-1)});
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(2);
  return torch::bmm(flat, w).view(shape);
}

// Adds a per-member vector [E, n] to x [E, ..., n].
torch::Tensor AddBias(const torch::Tensor& x, const torch::Tensor& b) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape.front() = b.size(0);
  shape.back() = b.size(1);
  return x + b.view(shape);
}

torch::Tensor LayerNorm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  torch::Tensor y = torch::layer_norm(x, {x.size(-1)}, {}, {}, 1e-5);
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape.front() = w.size(0);
  shape.back() = w.size(1);
  return y * w.view(shape) + b.view(shape);
}

}  // namespace

std::string HookPoint::name() const {
  const std::string L = absl::StrCat("L", layer + 1);  // layers count from 1 on every surface
  switch (kind) {
    case Kind::kEmbed:
      return "embed";
    case Kind::kResidPre:
      return L + ".resid_pre";
    case Kind::kPattern:
      return L + ".attn.pattern";
    case Kind::kHead:
      return L + ".attn.head";
    case Kind::kPostAttn:
      return L + ".post_attn";
    case Kind::kPostMlp:
      return L + ".post_mlp";
    case Kind::kFinalLn:
      return "final_ln";
    case Kind::kLogits:
      return "logits";
  }
  return "";
}

absl::StatusOr<HookPoint> ParseHookPoint(const std::string& name, int64_t layers, bool final_ln) {
  const std::string allowed =
      "embed, L{l}.resid_pre, L{l}.attn.pattern, L{l}.attn.head, L{l}.post_attn, "
      "L{l}.post_mlp, " +
      std::string(final_ln ? "final_ln, " : "") + "or logits with l in [1, " + std::to_string(layers) + "]";
  HookPoint p;
  if (name == "embed") return p;
  if (name == "final_ln" && final_ln) {
    p.kind = HookPoint::Kind::kFinalLn;
    return p;
  }
  if (name == "logits") {
    p.kind = HookPoint::Kind::kLogits;
    return p;
  }
  const size_t dot = name.find('.');
  if (name.size() < 3 || name[0] != 'L' || dot == std::string::npos || dot < 2) {
    return absl::InvalidArgumentError("hook point '" + name + "' is not one of " + allowed);
  }
  int layer = 0;
  for (size_t i = 1; i < dot; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) || layer > 1000) {
      return absl::InvalidArgumentError("hook point '" + name + "' is not one of " + allowed);
    }
    layer = layer * 10 + (name[i] - '0');
  }
  const std::string rest = name.substr(dot + 1);
  if (rest == "resid_pre") {
    p.kind = HookPoint::Kind::kResidPre;
  } else if (rest == "attn.pattern") {
    p.kind = HookPoint::Kind::kPattern;
  } else if (rest == "attn.head") {
    p.kind = HookPoint::Kind::kHead;
  } else if (rest == "post_attn") {
    p.kind = HookPoint::Kind::kPostAttn;
  } else if (rest == "post_mlp") {
    p.kind = HookPoint::Kind::kPostMlp;
  } else {
    return absl::InvalidArgumentError("hook point '" + name + "' is not one of " + allowed);
  }
  if (layer == 0) {
    return absl::InvalidArgumentError("hook point '" + name + "' names layer 0; layers count from 1 (L1 is the first " +
                                      "block; this model has L1 to L" + std::to_string(layers) + ")");
  }
  if (layer > layers) {
    return absl::InvalidArgumentError("hook point '" + name + "' names layer " + std::to_string(layer) +
                                      "; this model has layers 1 to " + std::to_string(layers));
  }
  p.layer = layer - 1;
  return p;
}

DecoderConfig DecoderConfigOf(const v1::ExperimentSpec& spec) {
  const auto& m = spec.model().decoder();
  DecoderConfig c;
  c.vocab = ShapeOf(spec).vocab;
  c.max_len = ShapeOf(spec).seq_len;
  c.d_model = m.d_model();
  c.heads = m.num_heads();
  c.mlp = m.mlp_width();
  c.layers = m.num_layers();
  c.gelu = m.activation() == v1::ACTIVATION_GELU;
  c.attn_bias = m.attention_bias();
  c.final_ln = m.final_layernorm();
  c.input_dim = SpecFamilyOf(spec).ContinuousInputWidth(spec);  // 0: token embedding
  c.init_std = m.init_std();
  c.torch_default_init = m.init() == v1::DECODER_INIT_TORCH_DEFAULT;
  c.rope_base = m.rope_base();
  return c;
}

torch::Tensor& DecoderModel::Add(const std::string& name, torch::Tensor t) {
  params_.push_back(t.to(device_).requires_grad_(true));
  names_.push_back(name);
  return params_.back();
}

DecoderModel::DecoderModel(const DecoderConfig& cfg, int64_t ensemble, torch::Device device)
    : cfg_(cfg), ensemble_(ensemble), device_(device) {
  const int64_t E = ensemble, D = cfg.d_model, F = cfg.mlp, V = cfg.vocab;
  auto z = [&](std::vector<int64_t> shape) { return torch::zeros(shape); };
  auto o = [&](std::vector<int64_t> shape) { return torch::ones(shape); };
  // Tensors are registered in this order; the checkpoint names them.
  if (cfg.input_dim > 0) {
    embed_ = Add("read_in", z({E, cfg.input_dim, D}));
    pad_ = Add("pad", z({E, cfg.input_dim}));
  } else {
    embed_ = Add("embed", z({E, V, D}));
  }
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::string p = absl::StrCat("L", l, ".");
    Block b;
    b.ln1_w = Add(p + "ln1.weight", o({E, D}));
    b.ln1_b = Add(p + "ln1.bias", z({E, D}));
    b.wq = Add(p + "attn.q", z({E, D, D}));
    b.wk = Add(p + "attn.k", z({E, D, D}));
    b.wv = Add(p + "attn.v", z({E, D, D}));
    b.wo = Add(p + "attn.o", z({E, D, D}));
    if (cfg.attn_bias) {
      b.bq = Add(p + "attn.q.bias", z({E, D}));
      b.bk = Add(p + "attn.k.bias", z({E, D}));
      b.bv = Add(p + "attn.v.bias", z({E, D}));
      b.bo = Add(p + "attn.o.bias", z({E, D}));
    }
    b.ln2_w = Add(p + "ln2.weight", o({E, D}));
    b.ln2_b = Add(p + "ln2.bias", z({E, D}));
    b.w1 = Add(p + "mlp.fc1.weight", z({E, D, F}));
    b.b1 = Add(p + "mlp.fc1.bias", z({E, F}));
    b.w2 = Add(p + "mlp.fc2.weight", z({E, F, D}));
    b.b2 = Add(p + "mlp.fc2.bias", z({E, D}));
    blocks_.push_back(b);
  }
  if (cfg.final_ln) {
    lnf_w_ = Add("ln_f.weight", o({E, D}));
    lnf_b_ = Add("ln_f.bias", z({E, D}));
  }
  head_w_ = Add("head.weight", z({E, D, V}));
  if (cfg.input_dim == 0) head_b_ = Add("head.bias", z({E, V}));

  const int64_t dh = D / cfg.heads, half = dh / 2;
  torch::Tensor inv = torch::pow(cfg.rope_base, -torch::arange(half, torch::kDouble) / static_cast<double>(half));
  torch::Tensor angle = torch::arange(cfg.max_len, torch::kDouble).unsqueeze(1) * inv.unsqueeze(0);
  cos_ = angle.cos().to(torch::kFloat).to(device_);
  sin_ = angle.sin().to(torch::kFloat).to(device_);
}

void DecoderModel::Initialize(const std::vector<uint64_t>& init_seeds) {
  torch::NoGradGuard no_grad;
  // A linear map's input width: its weight is [in, out]; a bias takes its
  // weight's ("attn.q.bias" -> "attn.q", "mlp.fc1.bias" -> "mlp.fc1.weight").
  auto fan_in = [&](const std::string& n) -> int64_t {
    std::string w = n;
    if (const size_t b = w.rfind(".bias"); b != std::string::npos) {
      w = w.substr(0, b);
      if (std::find(names_.begin(), names_.end(), w) == names_.end()) w += ".weight";
    }
    const auto it = std::find(names_.begin(), names_.end(), w);
    return it == names_.end() ? 0 : params_[static_cast<size_t>(it - names_.begin())].size(1);
  };
  for (int64_t e = 0; e < ensemble_; ++e) {
    torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(init_seeds[static_cast<size_t>(e)]);
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor slot = params_[i][e];
      const std::string& n = names_[i];
      const bool norm = n.find("ln") != std::string::npos;
      const bool gain = norm && n.find("weight") != std::string::npos;
      const bool bias = n.find("bias") != std::string::npos;
      if (gain) {
        slot.fill_(1.0);
      } else if (bias && (norm || !cfg_.torch_default_init)) {
        slot.zero_();
      } else if (!cfg_.torch_default_init) {
        slot.copy_(torch::randn(slot.sizes(), gen) * cfg_.init_std);
      } else if (n == "embed" || n == "pad") {
        slot.copy_(torch::randn(slot.sizes(), gen));
      } else {
        const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in(n)));
        slot.copy_((torch::rand(slot.sizes(), gen) * 2.0 - 1.0) * bound);
      }
    }
  }
}

torch::Tensor DecoderModel::Rope(const torch::Tensor& x) const {
  // Rotates the two halves of each head's dimensions (GPT-NeoX convention).
  const int64_t T = x.size(-2), half = x.size(-1) / 2;
  torch::Tensor c = cos_.narrow(0, 0, T), s = sin_.narrow(0, 0, T);
  if (x.scalar_type() != c.scalar_type()) {
    c = c.to(x.scalar_type());
    s = s.to(x.scalar_type());
  }
  torch::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return torch::cat({x1 * c - x2 * s, x1 * s + x2 * c}, -1);
}

torch::Tensor DecoderModel::MapstoInputs(const torch::Tensor& x, const torch::Tensor& y) const {
  const int64_t E = x.size(0), B = x.size(1), n = x.size(2), d = x.size(3);
  torch::Tensor xs = torch::cat({x, torch::zeros({E, B, n, 1}, x.options())}, -1);
  torch::Tensor ys = torch::cat({torch::zeros({E, B, n, d}, x.options()), y.unsqueeze(-1)}, -1);
  torch::Tensor pads = pad_.to(x.scalar_type()).view({E, 1, 1, d + 1}).expand({E, B, n, d + 1});
  return torch::stack({xs, pads, ys}, 3).reshape({E, B, 3 * n, d + 1});
}

torch::Tensor DecoderModel::Predictions(const torch::Tensor& outputs) {
  return outputs.squeeze(-1).slice(2, 1, outputs.size(2), 3);
}

torch::Tensor DecoderModel::Attention(const Block& b, const torch::Tensor& h, const HookFn* hook,
                                      const std::string& prefix, bool fused) const {
  const int64_t E = h.size(0), B = h.size(1), T = h.size(2), D = cfg_.d_model, H = cfg_.heads, dh = D / H;
  auto project = [&](const torch::Tensor& w, const torch::Tensor& bias) {
    return bias.defined() ? AddBias(Linear(h, w), bias) : Linear(h, w);  // [E, B, T, D]
  };
  if (fused) {  // one GEMM for q, k and v
    const torch::Tensor bias = b.bq.defined() ? torch::cat({b.bq, b.bk, b.bv}, 1) : torch::Tensor();
    return CausalAttention(Linear(h, torch::cat({b.wq, b.wk, b.wv}, 2)), bias, cos_, sin_, H);
  }
  auto heads = [&](const torch::Tensor& w, const torch::Tensor& bias) {
    return project(w, bias).view({E, B, T, H, dh}).permute({0, 1, 3, 2, 4});
  };
  torch::Tensor q = Rope(heads(b.wq, b.bq)), k = Rope(heads(b.wk, b.bk)), v = heads(b.wv, b.bv);  // [E, B, H, T, dh]
  torch::Tensor causal = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(h.device())).triu(1);
  torch::Tensor scores = torch::matmul(q, k.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(dh)));
  torch::Tensor pattern = torch::softmax(scores.masked_fill(causal, -std::numeric_limits<float>::infinity()), -1);
  if (hook != nullptr) pattern = ApplyHook(hook, prefix + "attn.pattern", pattern);
  torch::Tensor out = torch::matmul(pattern, v).permute({0, 1, 3, 2, 4});  // [E, B, T, H, dh]
  if (hook != nullptr) out = ApplyHook(hook, prefix + "attn.head", out);
  return out.reshape({E, B, T, D});
}

torch::Tensor DecoderModel::Forward(const torch::Tensor& tokens, const HookFn* hook, int upto) const {
  ThrowIfThreadCancelled();  // a cancelled analysis stops here (server/common/thread_cancel.h)
  const int64_t E = tokens.size(0), B = tokens.size(1), T = tokens.size(2);
  const int64_t D = cfg_.d_model, V = cfg_.vocab;
  torch::Tensor x;
  if (cfg_.input_dim > 0) {
    x = Linear(tokens.to(embed_.scalar_type()), embed_);
  } else {
    // Member e's rows of its own embedding.
    torch::Tensor offset = (torch::arange(E, tokens.options()) * V).view({E, 1, 1});
    x = embed_.reshape({E * V, D}).index_select(0, (tokens + offset).flatten()).view({E, B, T, D});
  }
  x = ApplyHook(hook, "embed", x);
  // The fused kernels (decoder_kernels.h) when no hook reads what they fuse.
  const bool fused = hook == nullptr && FusedKernelsApply(x);
  auto norm = [&](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& bias) {
    return fused ? MemberLayerNorm(in, w, bias) : LayerNorm(in, w, bias);
  };
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const Block& b = blocks_[static_cast<size_t>(l)];
    const std::string p = absl::StrCat("L", l + 1, ".");  // hook names count layers from 1
    if (hook != nullptr) x = ApplyHook(hook, p + "resid_pre", x);
    torch::Tensor h = norm(x, b.ln1_w, b.ln1_b);
    torch::Tensor out = Attention(b, h, hook, p, fused);  // [E, B, T, D]: the heads side by side
    torch::Tensor attn = Linear(out, b.wo);
    x = x + (b.bo.defined() ? AddBias(attn, b.bo) : attn);
    if (hook != nullptr) x = ApplyHook(hook, p + "post_attn", x);
    torch::Tensor m = Linear(norm(x, b.ln2_w, b.ln2_b), b.w1);
    if (fused) {
      m = BiasActivation(m, b.b1, cfg_.gelu ? MlpActivation::kGeluTanh : MlpActivation::kSilu);
    } else {
      m = AddBias(m, b.b1);
      m = cfg_.gelu ? torch::gelu(m, "tanh") : torch::silu(m);
    }
    x = x + AddBias(Linear(m, b.w2), b.b2);
    if (hook != nullptr) x = ApplyHook(hook, p + "post_mlp", x);
    if (upto >= 0 && l == upto) return x;
  }
  if (cfg_.final_ln) x = ApplyHook(hook, "final_ln", norm(x, lnf_w_, lnf_b_));
  torch::Tensor logits = Linear(x, head_w_);
  if (head_b_.defined()) logits = AddBias(logits, head_b_);
  return ApplyHook(hook, "logits", logits);
}

}  // namespace circuitlab::engine
