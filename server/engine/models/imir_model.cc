#include "server/engine/models/imir_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/common/thread_cancel.h"
#include "server/engine/basis/projector.h"
#include "server/engine/models/imir_block.h"

namespace circuitlab::engine {
namespace {

// values [E, K + 1] at `index` ([n] into K + 1) for every member: [E, n].
// One gather on the flattened values: the backward of a gather along
// dimension 1 adds slice by slice (an op per index: most of a paper-basis
// step), a 1-D one in one loop.
torch::Tensor GatherMembers(const torch::Tensor& values, const torch::Tensor& index) {
  const int64_t E = values.size(0), width = values.size(1);
  torch::Tensor flat = index;
  if (E > 1) flat = (index.unsqueeze(0) + torch::arange(E, index.options()).unsqueeze(1) * width).reshape({-1});
  return values.reshape({-1}).index_select(0, flat).view({E, index.numel()});
}

}  // namespace

ImirModel::ImirModel(const ImirModelConfig& config, int64_t ensemble, torch::Device device)
    : cfg_(config), ensemble_(ensemble), device_(device) {
  const auto opts = torch::TensorOptions().dtype(cfg_.float64 ? torch::kDouble : torch::kFloat).device(device_);
  if (coordinate_model()) {
    const int64_t K = static_cast<int64_t>(cfg_.coordinates->trained.size());
    coef_ = torch::zeros({ensemble_, K}, opts).requires_grad_(true);
    PlanCoordinates();
    return;
  }
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const int64_t d = width(l);
    kq_.push_back(torch::zeros({ensemble_, cfg_.heads, d, d}, opts).requires_grad_(true));
  }
  readout_ = torch::zeros({ensemble_, cfg_.vocab, width(cfg_.layers)}, opts).requires_grad_(true);
}

void ImirModel::PlanCoordinates() {
  const CoordinateConfig& cc = *cfg_.coordinates;
  const Basis& basis = cc.basis;
  const int64_t H = cfg_.heads, L = cfg_.layers, d0 = this->d0(), V = cfg_.vocab;
  const int64_t K = static_cast<int64_t>(cc.trained.size());
  TORCH_CHECK(basis.layers == L && basis.heads == H, "coordinate basis built for another model shape");
  TORCH_CHECK(static_cast<int64_t>(basis.kq.part.size()) == d0 * d0, "coordinate basis built for another task");
  position_of_.assign(basis.coords.size(), -1);
  std::vector<double> scale;
  for (int64_t i = 0; i < K; ++i) {
    const int32_t b = cc.trained[static_cast<size_t>(i)];
    position_of_.at(static_cast<size_t>(b)) = static_cast<int32_t>(i);
    scale.push_back(cc.unit_norm ? 1.0 / basis.coords[static_cast<size_t>(b)].norm : 1.0);
  }
  scale_ = torch::tensor(scale, torch::kDouble).to(coef_.options().requires_grad(false));

  const int64_t pk = static_cast<int64_t>(basis.kq.names.size());
  const int64_t pr = static_cast<int64_t>(basis.readout.names.size());
  int64_t offset = 0, n = 1;
  active_pairs_.assign(static_cast<size_t>(L), std::vector<std::vector<std::pair<int64_t, int64_t>>>(H));
  for (int64_t l = 0; l < L; ++l) {
    const int64_t d = n * d0;
    std::vector<int64_t> gather(static_cast<size_t>(H * d * d), K);
    for (int64_t h = 0; h < H; ++h) {
      std::map<std::pair<int64_t, int64_t>, bool> active;
      for (int64_t row = 0; row < d; ++row) {
        const int64_t qb = row / d0, r = row % d0;
        for (int64_t col = 0; col < d; ++col) {
          const int32_t part = basis.kq.part[static_cast<size_t>(r * d0 + col % d0)];
          if (part < 0) continue;
          const int64_t kb = col / d0;
          const int64_t index = offset + ((h * n + qb) * n + kb) * pk + part;
          const int32_t pos = position_of_[static_cast<size_t>(index)];
          if (pos < 0) continue;
          gather[static_cast<size_t>((h * d + row) * d + col)] = pos;
          active[{qb, kb}] = true;
        }
      }
      for (const auto& [pair, unused] : active) active_pairs_[l][h].push_back(pair);
    }
    kq_gather_.push_back(torch::tensor(gather, torch::kLong).to(device_));
    offset += H * n * n * pk;
    n *= H + 1;
  }
  std::vector<int64_t> gather(static_cast<size_t>(V * n * d0), K);
  std::vector<bool> readout_active(static_cast<size_t>(n), false);
  for (int64_t row = 0; row < V; ++row) {
    for (int64_t col = 0; col < n * d0; ++col) {
      const int32_t part = basis.readout.part[static_cast<size_t>(row * d0 + col % d0)];
      if (part < 0) continue;
      const int32_t pos = position_of_[static_cast<size_t>(offset + (col / d0) * pr + part)];
      if (pos < 0) continue;
      gather[static_cast<size_t>(row * n * d0 + col)] = pos;
      readout_active[static_cast<size_t>(col / d0)] = true;
    }
  }
  readout_gather_ = torch::tensor(gather, torch::kLong).to(device_);
  for (int64_t b = 0; b < n; ++b) {
    if (readout_active[static_cast<size_t>(b)]) readout_blocks_.push_back(b);
  }

  PlanSparse(n);
  PlanDependencies(readout_active);
}

void ImirModel::PlanSparse(int64_t n) {
  const int64_t H = cfg_.heads, L = cfg_.layers, d0 = this->d0(), V = cfg_.vocab;
  // The block-sparse forward pays off when few block pairs carry a
  // coordinate (a ticket, a circuit); with most of them the dense matmuls on
  // the materialised matrices are faster (bench/RESULTS.md).
  int64_t active = 0, pairs = 0;
  for (int64_t l = 0, m = 1; l < L; ++l, m *= H + 1) {
    for (int64_t h = 0; h < H; ++h) active += static_cast<int64_t>(active_pairs_[l][h].size());
    pairs += H * m * m;
  }
  const CoordinateConfig& cc = *cfg_.coordinates;
  sparse_ = cc.forward == CoordinateConfig::Forward::kAuto ? 2 * active <= pairs
                                                           : cc.forward == CoordinateConfig::Forward::kSparse;
  // Per active pair (and readout block), the gather of its d0 x d0 (V x d0)
  // block alone: the sparse forward never materialises the whole matrices.
  for (int64_t l = 0, m = 1; l < L; ++l, m *= H + 1) {
    const int64_t d = m * d0;
    const torch::Tensor full = kq_gather_[l].view({H, d, d});
    pair_gather_.emplace_back();
    for (int64_t h = 0; h < H; ++h) {
      pair_gather_[l].emplace_back();
      for (const auto& [qb, kb] : active_pairs_[l][h]) {
        pair_gather_[l][h].push_back(full[h].narrow(0, qb * d0, d0).narrow(1, kb * d0, d0).reshape({-1}).contiguous());
      }
    }
  }
  {
    const torch::Tensor full = readout_gather_.view({V, n * d0});
    for (int64_t b : readout_blocks_) readout_block_gather_.push_back(full.narrow(1, b * d0, d0).reshape({-1}).contiguous());
  }

}

void ImirModel::PlanDependencies(const std::vector<bool>& readout_active) {
  const int64_t H = cfg_.heads, L = cfg_.layers;
  // Which residual blocks and heads the readout depends on, layer by layer
  // from the top.
  block_needed_.assign(static_cast<size_t>(L + 1), {});
  head_needed_.assign(static_cast<size_t>(L), std::vector<bool>(static_cast<size_t>(H), false));
  block_needed_[L] = readout_active;
  for (int64_t l = L; l >= 1; --l) {
    const int64_t prev = block_needed_[l].size() / (H + 1);
    std::vector<bool> need(static_cast<size_t>(prev), false);
    for (int64_t pi = 0; pi < prev; ++pi) {
      if (block_needed_[l][pi]) need[pi] = true;  // skipped layer l
    }
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t pi = 0; pi < prev; ++pi) {
        if (!block_needed_[l][(h + 1) * prev + pi]) continue;
        head_needed_[l - 1][h] = true;
        need[pi] = true;  // the head copies block pi
      }
      if (!head_needed_[l - 1][h]) continue;
      for (const auto& [qb, kb] : active_pairs_[l - 1][h]) need[qb] = need[kb] = true;
    }
    block_needed_[l - 1] = need;
  }
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
    const auto dtype = coordinate_model() ? coef_.scalar_type() : readout_.scalar_type();
    auto draw = [&](torch::IntArrayRef shape) {
      if (cfg_.zero_init) return torch::zeros(shape, dtype);
      return torch::randn(shape, gen, dtype) * cfg_.init_std;
    };
    if (coordinate_model()) {
      coef_[e].copy_(draw(coef_[e].sizes()));
      continue;
    }
    for (auto& w : kq_) w[e].copy_(draw(w[e].sizes()));
    readout_[e].copy_(draw(readout_[e].sizes()));
  }
}

torch::Tensor ImirModel::ScaledValues() const {
  return torch::cat({coef_ * scale_, torch::zeros({ensemble_, 1}, coef_.options().requires_grad(false))}, 1);
}

torch::Tensor ImirModel::kq(int64_t layer) const {
  if (!coordinate_model()) return kq_[layer];
  const int64_t d = width(layer);
  return GatherMembers(ScaledValues(), kq_gather_[layer]).view({ensemble_, cfg_.heads, d, d});
}

torch::Tensor ImirModel::readout() const {
  if (!coordinate_model()) return readout_;
  return GatherMembers(ScaledValues(), readout_gather_).view({ensemble_, cfg_.vocab, width(cfg_.layers)});
}

void ImirModel::AssignDense(int64_t member, const std::vector<torch::Tensor>& kq, const torch::Tensor& readout) {
  torch::NoGradGuard no_grad;
  if (!coordinate_model()) {
    for (int64_t l = 0; l < cfg_.layers; ++l) kq_[l][member].copy_(kq.at(l));
    readout_[member].copy_(readout);
    return;
  }
  const Projection p = Projector(cfg_.coordinates->basis).ProjectTensors(kq, readout);
  for (int32_t b : cfg_.coordinates->trained) SetRawCoordinate(member, b, p.values[static_cast<size_t>(b)]);
}

void ImirModel::SetRawCoordinate(int64_t member, int32_t basis_index, double raw) {
  if (!coordinate_model()) return;
  const int32_t pos = position_of_.at(static_cast<size_t>(basis_index));
  TORCH_CHECK(pos >= 0, "basis element ", basis_index, " is not a trained coordinate of this model");
  torch::NoGradGuard no_grad;
  const double s = scale_[pos].item<double>();
  coef_.index_put_({member, pos}, raw / s);
}

std::vector<torch::Tensor> ImirModel::parameters() const {
  if (coordinate_model()) return {coef_};
  std::vector<torch::Tensor> params = kq_;
  params.push_back(readout_);
  return params;
}

std::vector<std::string> ImirModel::parameter_names() const {
  if (coordinate_model()) return {"coords"};
  std::vector<std::string> names;
  for (int64_t l = 0; l < cfg_.layers; ++l) names.push_back(absl::StrCat("L", l + 1, ".kq"));
  names.push_back("out");
  return names;
}

torch::Tensor ImirModel::Embed(const torch::Tensor& tokens, const torch::Tensor& pids) const {
  auto sizes = tokens.sizes().vec();
  sizes.push_back(d0());
  const auto opts = (coordinate_model() ? coef_ : readout_).options().requires_grad(false);
  torch::Tensor x = torch::zeros(sizes, opts);
  x.scatter_(-1, tokens.unsqueeze(-1), 1.0f);
  x.scatter_(-1, (pids + cfg_.vocab).unsqueeze(-1), 1.0f);
  return x;
}

torch::Tensor ImirModel::Forward(const torch::Tensor& tokens, const torch::Tensor& pids, bool all_positions,
                                std::vector<torch::Tensor>* attention, const HookFn* hook) const {
  ThrowIfThreadCancelled();  // a cancelled analysis stops here (server/common/thread_cancel.h)
  TORCH_CHECK(tokens.size(0) == ensemble_, "batch has ", tokens.size(0), " ensemble members, the model ", ensemble_);
  const bool block =
      !all_positions && attention == nullptr && hook == nullptr && device_.is_cpu() && !cfg_.reference_forward;
  if (!coordinate_model()) {
    return block ? BlockQueryLogits(tokens, pids, cfg_.vocab, kq_, readout_)
                 : DenseForward(tokens, pids, all_positions, kq_, readout_, attention, hook);
  }
  if (sparse_ && attention == nullptr && hook == nullptr) return SparseForward(tokens, pids, all_positions);
  // Most block pairs carry a coordinate: a few large matmuls on the
  // materialised matrices beat many small ones.
  const torch::Tensor values = ScaledValues();
  std::vector<torch::Tensor> kq;
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const int64_t d = width(l);
    kq.push_back(GatherMembers(values, kq_gather_[l]).view({ensemble_, cfg_.heads, d, d}));
  }
  const torch::Tensor readout =
      GatherMembers(values, readout_gather_).view({ensemble_, cfg_.vocab, width(cfg_.layers)});
  if (block) return BlockQueryLogits(tokens, pids, cfg_.vocab, kq, readout);
  return DenseForward(tokens, pids, all_positions, kq, readout, attention, hook);
}

torch::Tensor ImirModel::DenseForward(const torch::Tensor& tokens, const torch::Tensor& pids, bool all_positions,
                                      const std::vector<torch::Tensor>& kq_w, const torch::Tensor& readout_w,
                                      std::vector<torch::Tensor>* attention, const HookFn* hook) const {
  if (attention != nullptr) attention->clear();
  const int64_t E = tokens.size(0), B = tokens.size(1), T = tokens.size(2), H = cfg_.heads;
  torch::Tensor x = ApplyHook(hook, "embed", Embed(tokens, pids));  // [E, B, T, d]
  const torch::Tensor causal =
      torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(device_)).triu(1);
  // Hooks see every position of every layer (a hook at the last layer's
  // keys changes nothing at the query otherwise).
  const bool every = all_positions || hook != nullptr;
  const int64_t full_layers = every ? cfg_.layers : cfg_.layers - 1;

  for (int64_t l = 0; l < full_layers; ++l) {
    const int64_t d = x.size(-1);
    const std::string p = absl::StrCat("L", l + 1, ".");
    // Queries for every head: [E, H, B*T, d] -> [E, H, B, T, d].
    torch::Tensor q = torch::matmul(x.reshape({E, 1, B * T, d}), kq_w[l]).view({E, H, B, T, d});
    torch::Tensor xt = x.unsqueeze(1);                                   // [E, 1, B, T, d]
    torch::Tensor scores = torch::matmul(q, xt.transpose(-1, -2));       // [E, H, B, T, T]
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    torch::Tensor a = torch::softmax(scores, -1);
    if (hook != nullptr) a = ApplyHook(hook, p + "attn", a);
    if (attention != nullptr) attention->push_back(a.select(3, T - 1));  // [E, H, B, T]
    torch::Tensor y = torch::matmul(a, xt);                              // [E, H, B, T, d]
    if (hook != nullptr) {
      std::vector<torch::Tensor> heads;
      for (int64_t h = 0; h < H; ++h) heads.push_back(ApplyHook(hook, p + "H" + std::to_string(h + 1) + ".out", y.select(1, h)));
      y = torch::stack(heads, 1);
    }
    y = y.permute({0, 2, 3, 1, 4}).reshape({E, B, T, H * d});
    x = torch::cat({x, y}, -1);
    if (hook != nullptr) x = ApplyHook(hook, p + "resid", x);
  }
  if (every) {
    torch::Tensor logits =
        torch::matmul(x.reshape({E, B * T, x.size(-1)}), readout_w.transpose(1, 2)).view({E, B, T, cfg_.vocab});
    logits = ApplyHook(hook, "logits", logits);
    return all_positions ? logits : logits.select(2, T - 1);
  }

  // Last layer: only the query (last position) is read out, so only its
  // attention row is computed.
  const int64_t d = x.size(-1);
  torch::Tensor xq = x.select(2, T - 1);                                          // [E, B, d]
  torch::Tensor q = torch::matmul(xq.unsqueeze(1), kq_w[cfg_.layers - 1]);         // [E, H, B, d]
  torch::Tensor xt = x.unsqueeze(1);                                              // [E, 1, B, T, d]
  torch::Tensor scores = torch::matmul(q.unsqueeze(-2), xt.transpose(-1, -2));    // [E, H, B, 1, T]
  const torch::Tensor a = torch::softmax(scores, -1);
  if (attention != nullptr) attention->push_back(a.squeeze(-2));                  // [E, H, B, T]
  torch::Tensor y = torch::matmul(a, xt).squeeze(-2);                             // [E, H, B, d]
  y = y.permute({0, 2, 1, 3}).reshape({E, B, H * d});
  torch::Tensor xl = torch::cat({xq, y}, -1);                                     // [E, B, d_L]
  return torch::matmul(xl, readout_w.transpose(1, 2));                             // [E, B, V]
}

torch::Tensor ImirModel::SparseForward(const torch::Tensor& tokens, const torch::Tensor& pids,
                                       bool all_positions) const {
  const int64_t E = tokens.size(0), B = tokens.size(1), T = tokens.size(2), H = cfg_.heads, d0 = this->d0();
  const torch::Tensor values = ScaledValues();
  const torch::Tensor causal =
      torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(device_)).triu(1);
  // x[pi]: residual block pi, [E, B, Tq, d0] (Tq = T, or 1 after the last
  // layer when only the query is read out); undefined when nothing reads it.
  std::vector<torch::Tensor> x = {Embed(tokens, pids)};
  // [E, B, t, d0] x [E, d0, m] -> [E, B, t, m] as one batched matmul over E
  // (a broadcast matmul would copy the matrix B times).
  auto times = [&](const torch::Tensor& xs, const torch::Tensor& w) {
    const int64_t t = xs.size(2);
    return torch::bmm(xs.reshape({E, B * t, d0}), w).view({E, B, t, w.size(-1)});
  };
  int64_t n = 1;
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const bool query_only = !all_positions && l == cfg_.layers - 1;
    const int64_t Tq = query_only ? 1 : T;
    auto rows = [&](const torch::Tensor& t) { return query_only ? t.narrow(2, T - 1, 1) : t; };
    std::vector<torch::Tensor> next(static_cast<size_t>(n * (H + 1)));
    for (int64_t pi = 0; pi < n; ++pi) {
      if (block_needed_[l + 1][pi]) next[pi] = rows(x[pi]);
    }
    for (int64_t h = 0; h < H; ++h) {
      if (!head_needed_[l][h]) continue;
      // scores = sum over key blocks kb of (sum_qb x_qb W[qb, kb]) x_kb^T.
      std::map<int64_t, torch::Tensor> queries;
      for (size_t i = 0; i < active_pairs_[l][h].size(); ++i) {
        const auto [qb, kb] = active_pairs_[l][h][i];
        const torch::Tensor w = GatherMembers(values, pair_gather_[l][h][i]).view({E, d0, d0});
        torch::Tensor q = times(rows(x[qb]), w);
        auto it = queries.find(kb);
        if (it == queries.end()) {
          queries.emplace(kb, q);
        } else {
          it->second = it->second + q;
        }
      }
      torch::Tensor scores;
      for (const auto& [kb, q] : queries) {
        torch::Tensor s = torch::matmul(q, x[kb].transpose(-1, -2));  // [E, B, Tq, T]
        scores = scores.defined() ? scores + s : s;
      }
      if (!scores.defined()) scores = torch::zeros({E, B, Tq, T}, values.options());
      if (!query_only) scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
      const torch::Tensor attn = torch::softmax(scores, -1);
      for (int64_t pi = 0; pi < n; ++pi) {
        const int64_t out = (h + 1) * n + pi;
        if (block_needed_[l + 1][out]) next[out] = torch::matmul(attn, x[pi]);
      }
    }
    x = std::move(next);
    n *= H + 1;
  }
  const int64_t Tq = all_positions ? T : 1;
  torch::Tensor logits;
  for (size_t i = 0; i < readout_blocks_.size(); ++i) {
    const int64_t b = readout_blocks_[i];
    const torch::Tensor r = GatherMembers(values, readout_block_gather_[i]).view({E, cfg_.vocab, d0});
    torch::Tensor part = times(x[b], r.transpose(1, 2));  // [E, B, Tq, V]
    logits = logits.defined() ? logits + part : part;
  }
  if (!logits.defined()) logits = torch::zeros({E, B, Tq, cfg_.vocab}, values.options());
  return all_positions ? logits : logits.squeeze(2);
}

}  // namespace circuitlab::engine
