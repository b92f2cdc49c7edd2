#include "server/engine/manifold/projection.h"

#include <cmath>

namespace circuitlab::engine {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// Part ids of one block as an index tensor; entries in no part go to an extra
// "dump" bin at index n.
torch::Tensor PartIndex(const BlockParts& parts) {
  std::vector<int64_t> ids(parts.part.begin(), parts.part.end());
  const int64_t dump = static_cast<int64_t>(parts.names.size());
  for (int64_t& id : ids) id = id < 0 ? dump : id;
  return torch::tensor(ids, torch::kLong);
}

torch::Tensor Sizes(const BlockParts& parts) { return torch::tensor(parts.sizes, kF64); }

// blocks: [n_blocks, entries]. Returns per-block sums over each part [n_blocks, parts].
torch::Tensor PartSums(const torch::Tensor& blocks, const BlockParts& parts) {
  const int64_t n = static_cast<int64_t>(parts.names.size());
  torch::Tensor sums = torch::zeros({blocks.size(0), n + 1}, kF64);
  sums.index_add_(1, PartIndex(parts), blocks);
  return sums.narrow(1, 0, n);
}

// [H, n*d0, n*d0] -> [H*n*n, d0*d0], blocks in (head, query block, key block) order.
torch::Tensor KqBlocks(const torch::Tensor& w, int64_t n, int64_t d0) {
  const int64_t H = w.size(0);
  return w.view({H, n, d0, n, d0}).permute({0, 1, 3, 2, 4}).reshape({H * n * n, d0 * d0});
}

}  // namespace

double MatrixNorms::rho() const {
  if (total_sq <= 0) return 0.0;
  return std::sqrt(std::max(0.0, total_sq - on_sq) / total_sq);
}

double Projection::rho() const {
  double total = 0, on = 0;
  for (const MatrixNorms& m : matrices) {
    total += m.total_sq;
    on += m.on_sq;
  }
  return total <= 0 ? 0.0 : std::sqrt(std::max(0.0, total - on) / total);
}

Projection Project(const ImirModel& model, int64_t member, const Basis& basis) {
  torch::NoGradGuard no_grad;
  const int64_t d0 = model.d0(), H = model.config().heads, V = model.config().vocab;
  Projection out;
  out.values.reserve(basis.coords.size());
  const torch::Tensor kq_sizes = Sizes(basis.kq);
  int64_t n = 1;
  for (int64_t l = 0; l < model.config().layers; ++l) {
    torch::Tensor w = model.kq(l)[member].detach().to(torch::kCPU, torch::kDouble);
    torch::Tensor sums = PartSums(KqBlocks(w, n, d0), basis.kq).view({H, n * n, -1});  // [H, n*n, parts]
    torch::Tensor means = sums / kq_sizes;
    torch::Tensor on = (sums * means).sum({1, 2});
    torch::Tensor total = w.pow(2).sum({1, 2});
    const double* m = means.contiguous().data_ptr<double>();
    out.values.insert(out.values.end(), m, m + means.numel());
    for (int64_t h = 0; h < H; ++h) {
      out.matrices.push_back({"L" + std::to_string(l + 1) + "H" + std::to_string(h + 1), total[h].item<double>(),
                              on[h].item<double>()});
    }
    n *= H + 1;
  }
  torch::Tensor r = model.readout()[member].detach().to(torch::kCPU, torch::kDouble);  // [V, n*d0]
  torch::Tensor blocks = r.view({V, n, d0}).permute({1, 0, 2}).reshape({n, V * d0});
  torch::Tensor sums = PartSums(blocks, basis.readout);
  torch::Tensor means = sums / Sizes(basis.readout);
  const double* m = means.contiguous().data_ptr<double>();
  out.values.insert(out.values.end(), m, m + means.numel());
  out.matrices.push_back({"OUT", r.pow(2).sum().item<double>(), (sums * means).sum().item<double>()});
  return out;
}

void LoadProjected(const Basis& basis, const Projection& p, ImirModel& target, int64_t member) {
  torch::NoGradGuard no_grad;
  const int64_t d0 = target.d0(), H = target.config().heads, V = target.config().vocab;
  torch::Tensor values = torch::tensor(p.values, kF64);
  int64_t offset = 0, n = 1;
  auto fill = [&](const BlockParts& parts, int64_t blocks) {
    const int64_t np = static_cast<int64_t>(parts.names.size());
    torch::Tensor means = values.narrow(0, offset, blocks * np).view({blocks, np});
    offset += blocks * np;
    torch::Tensor padded = torch::cat({means, torch::zeros({blocks, 1}, kF64)}, 1);  // dump bin -> 0
    return padded.index_select(1, PartIndex(parts));                               // [blocks, entries]
  };
  for (int64_t l = 0; l < target.config().layers; ++l) {
    torch::Tensor blocks = fill(basis.kq, H * n * n).view({H, n, n, d0, d0}).permute({0, 1, 3, 2, 4});
    target.kq(l)[member].copy_(blocks.reshape({H, n * d0, n * d0}));
    n *= H + 1;
  }
  torch::Tensor blocks = fill(basis.readout, n).view({n, V, d0}).permute({1, 0, 2});
  target.readout()[member].copy_(blocks.reshape({V, n * d0}));
}

}  // namespace circuitlab::engine
