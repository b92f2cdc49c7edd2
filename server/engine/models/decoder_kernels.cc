#include "server/engine/models/decoder_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "server/engine/models/cpu_clones.h"

namespace circuitlab::engine {
namespace {

// exp(x) in float, branch-free so that GCC vectorises the loops that call it
// (the Cephes expf polynomial after a range reduction by powers of two;
// relative error ~2e-7 on [-87, 88], inputs outside clamped).
[[gnu::always_inline]] inline float ExpApprox(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float t = x * 1.44269504088896341f;
  const int32_t n = static_cast<int32_t>(t + (t >= 0.0f ? 0.5f : -0.5f));  // round to nearest
  const float fn = static_cast<float>(n);
  const float r = (x - fn * 0.693359375f) - fn * -2.12194440e-4f;  // x - n ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  return e * std::bit_cast<float>((n + 127) << 23);
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// One row: z = h + b, y = act(z).
CIRCUITLAB_CPU_CLONES void SiluRow(const float* h, const float* b, float* z, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = h[i] + b[i];
    z[i] = v;
    y[i] = v / (1.0f + ExpApprox(-v));
  }
}

CIRCUITLAB_CPU_CLONES void GeluRow(const float* h, const float* b, float* z, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = h[i] + b[i];
    z[i] = v;
    const float e = ExpApprox(2.0f * kGeluC * (v + kGeluA * v * v * v));
    y[i] = v * (e / (1.0f + e));  // v (1 + tanh(u)) / 2, e / (1 + e) first: e may be ~1e38
  }
}

// One row of the backward: dz = dy * act'(z); db += dz.
CIRCUITLAB_CPU_CLONES void SiluGradRow(const float* z, const float* dy, float* dz, float* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + ExpApprox(-z[i]));
    const float g = dy[i] * s * (1.0f + z[i] * (1.0f - s));
    dz[i] = g;
    db[i] += g;
  }
}

CIRCUITLAB_CPU_CLONES void GeluGradRow(const float* z, const float* dy, float* dz, float* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // With p = (1 + tanh(u)) / 2 = e / (1 + e), e = exp(2u): the derivative
    // p + v (1 - tanh^2) / 2 u' has 1 - tanh^2 = 4 p (1 - p), 1 - p = 1 / (1 + e),
    // which keeps its precision at either tail (1 - t * t would cancel).
    const float v = z[i];
    const float e = ExpApprox(2.0f * kGeluC * (v + kGeluA * v * v * v)), inv = 1.0f / (1.0f + e), p = e * inv;
    const float d = p + 2.0f * v * p * inv * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    const float g = dy[i] * d;
    dz[i] = g;
    db[i] += g;
  }
}

// Sum of x[0..n) with eight partial sums (vectorised without reassociating).
[[gnu::always_inline]] inline float SumBody(const float* x, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += x[i + k];
  }
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (int k = 0; k < 8; ++k) s += acc[k];
  return s;
}

// One row of the LayerNorm: xhat = (x - mean) * rstd, y = xhat * w + b.
// Returns rstd. Two passes (mean, then the centred variance), as ATen.
CIRCUITLAB_CPU_CLONES float LayerNormRow(const float* x, const float* w, const float* b, float* xhat, float* y,
                                         int64_t n, float eps) {
  const float mean = SumBody(x, n) / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) xhat[i] = x[i] - mean;
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += xhat[i + k] * xhat[i + k];
  }
  float var = 0;
  for (; i < n; ++i) var += xhat[i] * xhat[i];
  for (int k = 0; k < 8; ++k) var += acc[k];
  const float rstd = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) {
    xhat[j] *= rstd;
    y[j] = xhat[j] * w[j] + b[j];
  }
  return rstd;
}

// One row of its backward: g = dy * w; dx = rstd (g - mean(g) - xhat mean(g
// xhat)); dw += dy xhat; db += dy. `g` is scratch of n floats.
CIRCUITLAB_CPU_CLONES void LayerNormGradRow(const float* xhat, const float* dy, const float* w, float rstd, float* g,
                                            float* dx, float* dw, float* db, int64_t n) {
  float gs[8] = {}, gx[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) {
      const float v = dy[i + k] * w[i + k];
      g[i + k] = v;
      gs[k] += v;
      gx[k] += v * xhat[i + k];
    }
  }
  float sum_g = 0, sum_gx = 0;
  for (; i < n; ++i) {
    g[i] = dy[i] * w[i];
    sum_g += g[i];
    sum_gx += g[i] * xhat[i];
  }
  for (int k = 0; k < 8; ++k) {
    sum_g += gs[k];
    sum_gx += gx[k];
  }
  const float inv_n = 1.0f / static_cast<float>(n), mg = sum_g * inv_n, mgx = sum_gx * inv_n;
  for (int64_t j = 0; j < n; ++j) {
    dx[j] = rstd * (g[j] - mg - xhat[j] * mgx);
    dw[j] += dy[j] * xhat[j];
    db[j] += dy[j];
  }
}

// [E, rows, width] views of a tensor [E, ..., width] and its member's rows.
int64_t RowsPerMember(const torch::Tensor& x) { return x.numel() / (x.size(0) * x.size(-1)); }

class BiasActivationFn : public torch::autograd::Function<BiasActivationFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h_in,
                               const torch::Tensor& bias_in, int64_t act) {
    const torch::Tensor h = h_in.contiguous(), bias = bias_in.contiguous();
    const int64_t E = h.size(0), F = h.size(-1), N = RowsPerMember(h);
    torch::Tensor z = torch::empty_like(h), y = torch::empty_like(h);
    const float *hp = h.data_ptr<float>(), *bp = bias.data_ptr<float>();
    float *zp = z.data_ptr<float>(), *yp = y.data_ptr<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < N; ++r) {
        const int64_t off = (e * N + r) * F;
        if (act == static_cast<int64_t>(MlpActivation::kSilu)) {
          SiluRow(hp + off, bp + e * F, zp + off, yp + off, F);
        } else {
          GeluRow(hp + off, bp + e * F, zp + off, yp + off, F);
        }
      }
    }
    ctx->save_for_backward({z});
    ctx->saved_data["act"] = act;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor z = ctx->get_saved_variables()[0];
    const int64_t act = ctx->saved_data["act"].toInt();
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t E = z.size(0), F = z.size(-1), N = RowsPerMember(z);
    torch::Tensor dz = torch::empty_like(z), db = torch::zeros({E, F}, z.options());
    const float *zp = z.data_ptr<float>(), *gp = dy.data_ptr<float>();
    float *dzp = dz.data_ptr<float>(), *dbp = db.data_ptr<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < N; ++r) {
        const int64_t off = (e * N + r) * F;
        if (act == static_cast<int64_t>(MlpActivation::kSilu)) {
          SiluGradRow(zp + off, gp + off, dzp + off, dbp + e * F, F);
        } else {
          GeluGradRow(zp + off, gp + off, dzp + off, dbp + e * F, F);
        }
      }
    }
    return {dz, db, torch::Tensor()};
  }
};

class MemberLayerNormFn : public torch::autograd::Function<MemberLayerNormFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& w_in, const torch::Tensor& b_in, double eps) {
    const torch::Tensor x = x_in.contiguous(), w = w_in.contiguous(), b = b_in.contiguous();
    const int64_t E = x.size(0), D = x.size(-1), N = RowsPerMember(x);
    torch::Tensor xhat = torch::empty_like(x), y = torch::empty_like(x), rstd = torch::empty({E, N}, x.options());
    const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *bp = b.data_ptr<float>();
    float *hp = xhat.data_ptr<float>(), *yp = y.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < N; ++r) {
        const int64_t off = (e * N + r) * D;
        rp[e * N + r] = LayerNormRow(xp + off, wp + e * D, bp + e * D, hp + off, yp + off, D, static_cast<float>(eps));
      }
    }
    ctx->save_for_backward({xhat, rstd, w});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor &xhat = saved[0], &rstd = saved[1], &w = saved[2];
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t E = xhat.size(0), D = xhat.size(-1), N = RowsPerMember(xhat);
    torch::Tensor dx = torch::empty_like(xhat), dw = torch::zeros({E, D}, xhat.options()),
                  db = torch::zeros({E, D}, xhat.options());
    std::vector<float> scratch(static_cast<size_t>(D));
    const float *hp = xhat.data_ptr<float>(), *gp = dy.data_ptr<float>(), *wp = w.data_ptr<float>(),
                *rp = rstd.data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *dwp = dw.data_ptr<float>(), *dbp = db.data_ptr<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < N; ++r) {
        const int64_t off = (e * N + r) * D;
        LayerNormGradRow(hp + off, gp + off, wp + e * D, rp[e * N + r], scratch.data(), dxp + off, dwp + e * D,
                         dbp + e * D, D);
      }
    }
    return {dx, dw, db, torch::Tensor()};
  }
};

}  // namespace

bool FusedKernelsApply(const torch::Tensor& x) { return x.device().is_cpu() && x.scalar_type() == torch::kFloat; }

torch::Tensor BiasActivation(const torch::Tensor& h, const torch::Tensor& bias, MlpActivation act) {
  TORCH_CHECK(FusedKernelsApply(h) && FusedKernelsApply(bias), "BiasActivation: float32 CPU tensors only");
  TORCH_CHECK(bias.dim() == 2 && h.size(0) == bias.size(0) && h.size(-1) == bias.size(1),
              "BiasActivation: bias must be [E, F] for h [E, ..., F]");
  return BiasActivationFn::apply(h, bias, static_cast<int64_t>(act));
}

torch::Tensor MemberLayerNorm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, double eps) {
  TORCH_CHECK(FusedKernelsApply(x) && FusedKernelsApply(w) && FusedKernelsApply(b),
              "MemberLayerNorm: float32 CPU tensors only");
  TORCH_CHECK(w.dim() == 2 && w.sizes() == b.sizes() && x.size(0) == w.size(0) && x.size(-1) == w.size(1),
              "MemberLayerNorm: w and b must be [E, D] for x [E, ..., D]");
  return MemberLayerNormFn::apply(x, w, b, eps);
}

}  // namespace circuitlab::engine
