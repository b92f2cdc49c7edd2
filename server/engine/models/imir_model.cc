#include "server/engine/models/imir_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <string>

namespace circuitlab::engine {

ImirModel::ImirModel(const ImirModelConfig& config, int64_t ensemble, torch::Device device)
    : cfg_(config), ensemble_(ensemble), device_(device) {
  const auto opts = torch::TensorOptions().dtype(cfg_.float64 ? torch::kDouble : torch::kFloat).device(device_);
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const int64_t d = width(l);
    kq_.push_back(torch::zeros({ensemble_, cfg_.heads, d, d}, opts).requires_grad_(true));
  }
  readout_ = torch::zeros({ensemble_, cfg_.vocab, width(cfg_.layers)}, opts).requires_grad_(true);
}

int64_t ImirModel::width(int64_t layer) const {
  int64_t d = d0();
  for (int64_t l = 0; l < layer; ++l) d *= (cfg_.heads + 1);
  return d;
}

void ImirModel::Initialize(const std::vector<uint64_t>& init_seeds) {
  torch::NoGradGuard no_grad;
  for (int64_t e = 0; e < ensemble_; ++e) {
    torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(init_seeds.at(e));
    // Drawn in the parameters' own dtype, so float32 runs keep their values.
    const auto dtype = readout_.scalar_type();
    auto draw = [&](torch::IntArrayRef shape) {
      if (cfg_.zero_init) return torch::zeros(shape, dtype);
      return torch::randn(shape, gen, dtype) * cfg_.init_std;
    };
    for (auto& w : kq_) w[e].copy_(draw(w[e].sizes()));
    readout_[e].copy_(draw(readout_[e].sizes()));
  }
}

std::vector<torch::Tensor> ImirModel::parameters() const {
  std::vector<torch::Tensor> params = kq_;
  params.push_back(readout_);
  return params;
}

std::vector<std::string> ImirModel::parameter_names() const {
  std::vector<std::string> names;
  for (int64_t l = 0; l < cfg_.layers; ++l) names.push_back("L" + std::to_string(l + 1) + ".kq");
  names.push_back("out");
  return names;
}

torch::Tensor ImirModel::Embed(const torch::Tensor& tokens, const torch::Tensor& pids) const {
  auto sizes = tokens.sizes().vec();
  sizes.push_back(d0());
  torch::Tensor x = torch::zeros(sizes, readout_.options().requires_grad(false));
  x.scatter_(-1, tokens.unsqueeze(-1), 1.0f);
  x.scatter_(-1, (pids + cfg_.vocab).unsqueeze(-1), 1.0f);
  return x;
}

torch::Tensor ImirModel::Forward(const torch::Tensor& tokens, const torch::Tensor& pids, bool all_positions) const {
  const int64_t E = tokens.size(0), B = tokens.size(1), T = tokens.size(2), H = cfg_.heads;
  TORCH_CHECK(E == ensemble_, "batch has ", E, " ensemble members, the model ", ensemble_);
  torch::Tensor x = Embed(tokens, pids);  // [E, B, T, d]
  const torch::Tensor causal =
      torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(device_)).triu(1);
  const int64_t full_layers = all_positions ? cfg_.layers : cfg_.layers - 1;

  for (int64_t l = 0; l < full_layers; ++l) {
    const int64_t d = x.size(-1);
    // Queries for every head: [E, H, B*T, d] -> [E, H, B, T, d].
    torch::Tensor q = torch::matmul(x.reshape({E, 1, B * T, d}), kq_[l]).view({E, H, B, T, d});
    torch::Tensor xt = x.unsqueeze(1);                                   // [E, 1, B, T, d]
    torch::Tensor scores = torch::matmul(q, xt.transpose(-1, -2));       // [E, H, B, T, T]
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    torch::Tensor y = torch::matmul(torch::softmax(scores, -1), xt);     // [E, H, B, T, d]
    y = y.permute({0, 2, 3, 1, 4}).reshape({E, B, T, H * d});
    x = torch::cat({x, y}, -1);
  }
  if (all_positions) {
    return torch::matmul(x.reshape({E, B * T, x.size(-1)}), readout_.transpose(1, 2)).view({E, B, T, cfg_.vocab});
  }

  // Last layer: only the query (last position) is read out, so only its
  // attention row is computed.
  const int64_t d = x.size(-1);
  torch::Tensor xq = x.select(2, T - 1);                                          // [E, B, d]
  torch::Tensor q = torch::matmul(xq.unsqueeze(1), kq_[cfg_.layers - 1]);         // [E, H, B, d]
  torch::Tensor xt = x.unsqueeze(1);                                              // [E, 1, B, T, d]
  torch::Tensor scores = torch::matmul(q.unsqueeze(-2), xt.transpose(-1, -2));    // [E, H, B, 1, T]
  torch::Tensor y = torch::matmul(torch::softmax(scores, -1), xt).squeeze(-2);    // [E, H, B, d]
  y = y.permute({0, 2, 1, 3}).reshape({E, B, H * d});
  torch::Tensor xl = torch::cat({xq, y}, -1);                                     // [E, B, d_L]
  return torch::matmul(xl, readout_.transpose(1, 2));                             // [E, B, V]
}

}  // namespace circuitlab::engine
