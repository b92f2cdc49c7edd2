#include "server/engine/basis/projector.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "server/engine/torch_util.h"

namespace circuitlab::engine {
namespace {

// Part ids of one block as an index tensor; entries in no part go to an extra
// "dump" bin at index n.
torch::Tensor PartIndex(const BlockParts& parts) {
  std::vector<int64_t> ids(parts.part.begin(), parts.part.end());
  const int64_t dump = static_cast<int64_t>(parts.names.size());
  for (int64_t& id : ids) id = id < 0 ? dump : id;
  return torch::tensor(ids, torch::kLong);
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

Projector::Projector(const Basis& basis)
    : basis_(basis),
      kq_index_(PartIndex(basis.kq)),
      readout_index_(PartIndex(basis.readout)) {}

Projection Projector::ProjectTensors(const std::vector<torch::Tensor>& kq, const torch::Tensor& readout) const {
  // One pass over the weights per matrix, accumulating part sums in float64:
  // this runs at every recording step, and a few hundred tiny tensor ops
  // would cost ten times the arithmetic.
  torch::NoGradGuard no_grad;
  const int64_t V = readout.size(0), d0 = kq.at(0).size(-1), H = kq.at(0).size(0);
  const std::vector<int32_t>& kq_part = basis_.kq.part;
  const std::vector<int32_t>& ro_part = basis_.readout.part;
  const size_t kq_parts = basis_.kq.names.size(), ro_parts = basis_.readout.names.size();
  Projection out;
  out.values.reserve(basis_.coords.size());
  auto finish = [&](const std::vector<double>& sums, const std::vector<int64_t>& sizes, size_t parts,
                    const std::string& name, double total) {
    double on = 0;
    for (size_t i = 0; i < sums.size(); ++i) {
      const double mean = sums[i] / static_cast<double>(sizes[i % parts]);
      out.values.push_back(mean);
      on += sums[i] * mean;
    }
    out.matrices.push_back({name, total, on});
  };
  // Reads float32 or float64 weights in place (no converted copy).
  auto cpu = [](const torch::Tensor& t) {
    torch::Tensor c = t.detach().to(torch::kCPU);
    return c.scalar_type() == torch::kFloat || c.scalar_type() == torch::kDouble ? c.contiguous()
                                                                                 : c.to(torch::kDouble).contiguous();
  };
  auto visit = [](const torch::Tensor& t, auto&& fn) {
    if (t.scalar_type() == torch::kFloat) {
      fn(t.data_ptr<float>());
    } else {
      fn(t.data_ptr<double>());
    }
  };
  int64_t n = 1;
  for (size_t l = 0; l < kq.size(); ++l) {
    const torch::Tensor w = cpu(kq[l]);  // [H, n d0, n d0]
    const int64_t width = n * d0;
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> sums(static_cast<size_t>(n * n) * kq_parts, 0.0);
      double total = 0;
      visit(w, [&](const auto* data) {
        const auto* wh = data + h * width * width;
        for (int64_t row = 0; row < width; ++row) {
          const int64_t qb = row / d0, r = row % d0;
          for (int64_t col = 0; col < width; ++col) {
            const double v = wh[row * width + col];
            total += v * v;
            const int32_t part = kq_part[static_cast<size_t>(r * d0 + col % d0)];
            if (part >= 0) sums[static_cast<size_t>(qb * n + col / d0) * kq_parts + part] += v;
          }
        }
      });
      finish(sums, basis_.kq.sizes, kq_parts, absl::StrCat("L", l + 1, "H", h + 1), total);
    }
    n *= H + 1;
  }
  const torch::Tensor r = cpu(readout);  // [V, n d0]
  std::vector<double> sums(static_cast<size_t>(n) * ro_parts, 0.0);
  double total = 0;
  visit(r, [&](const auto* data) {
    for (int64_t row = 0; row < V; ++row) {
      for (int64_t col = 0; col < n * d0; ++col) {
        const double v = data[row * n * d0 + col];
        total += v * v;
        const int32_t part = ro_part[static_cast<size_t>(row * d0 + col % d0)];
        if (part >= 0) sums[static_cast<size_t>(col / d0) * ro_parts + part] += v;
      }
    }
  });
  finish(sums, basis_.readout.sizes, ro_parts, "OUT", total);
  return out;
}

DenseWeights Projector::OnManifold(const Projection& p, int64_t layers, int64_t heads, int64_t d0,
                                   int64_t vocab) const {
  torch::NoGradGuard no_grad;
  const int64_t H = heads, V = vocab;
  torch::Tensor values = torch::tensor(p.values, kF64);
  int64_t offset = 0, n = 1;
  auto fill = [&](const BlockParts& parts, const torch::Tensor& index, int64_t blocks) {
    const int64_t np = static_cast<int64_t>(parts.names.size());
    torch::Tensor means = values.narrow(0, offset, blocks * np).view({blocks, np});
    offset += blocks * np;
    torch::Tensor padded = torch::cat({means, torch::zeros({blocks, 1}, kF64)}, 1);  // dump bin -> 0
    return padded.index_select(1, index);                                           // [blocks, entries]
  };
  DenseWeights w;
  for (int64_t l = 0; l < layers; ++l) {
    torch::Tensor blocks = fill(basis_.kq, kq_index_, H * n * n).view({H, n, n, d0, d0}).permute({0, 1, 3, 2, 4});
    w.kq.push_back(blocks.reshape({H, n * d0, n * d0}));
    n *= H + 1;
  }
  torch::Tensor blocks = fill(basis_.readout, readout_index_, n).view({n, V, d0}).permute({1, 0, 2});
  w.readout = blocks.reshape({V, n * d0});
  return w;
}

}  // namespace circuitlab::engine
