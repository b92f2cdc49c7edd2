#include "server/engine/models/decoder_kernels.h"

#include <algorithm>
#include <atomic>
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

// One row: y = act(h + b).
CIRCUITLAB_CPU_CLONES void SiluRow(const float* __restrict h, const float* __restrict b, float* __restrict y,
                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = h[i] + b[i];
    y[i] = v / (1.0f + ExpApprox(-v));
  }
}

CIRCUITLAB_CPU_CLONES void GeluRow(const float* __restrict h, const float* __restrict b, float* __restrict y,
                                   int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = h[i] + b[i];
    const float e = ExpApprox(2.0f * kGeluC * (v + kGeluA * v * v * v));
    y[i] = v * (e / (1.0f + e));  // v (1 + tanh(u)) / 2, e / (1 + e) first: e may be ~1e38
  }
}

// One row of the backward: dz = dy * act'(z) for z = h + b; db += dz.
CIRCUITLAB_CPU_CLONES void SiluGradRow(const float* __restrict h, const float* __restrict b, const float* __restrict dy,
                                       float* __restrict dz, float* __restrict db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = h[i] + b[i];
    const float s = 1.0f / (1.0f + ExpApprox(-v));
    const float g = dy[i] * s * (1.0f + v * (1.0f - s));
    dz[i] = g;
    db[i] += g;
  }
}

CIRCUITLAB_CPU_CLONES void GeluGradRow(const float* __restrict h, const float* __restrict b, const float* __restrict dy,
                                       float* __restrict dz, float* __restrict db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // With p = (1 + tanh(u)) / 2 = e / (1 + e), e = exp(2u): the derivative
    // p + v (1 - tanh^2) / 2 u' has 1 - tanh^2 = 4 p (1 - p), 1 - p = 1 / (1 + e),
    // which keeps its precision at either tail (1 - t * t would cancel).
    const float v = h[i] + b[i];
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
CIRCUITLAB_CPU_CLONES float LayerNormRow(const float* __restrict x, const float* __restrict w,
                                         const float* __restrict b, float* __restrict xhat, float* __restrict y,
                                         int64_t n, float eps) {
  const float mean = SumBody(x, n) / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) xhat[i] = x[i] - mean;
  const float var = DotBody(xhat, xhat, n);
  const float rstd = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) {
    xhat[j] *= rstd;
    y[j] = xhat[j] * w[j] + b[j];
  }
  return rstd;
}

// One row of its backward: g = dy * w; dx = rstd (g - mean(g) - xhat mean(g
// xhat)); dw += dy xhat; db += dy. `g` is scratch of n floats.
CIRCUITLAB_CPU_CLONES void LayerNormGradRow(const float* __restrict xhat, const float* __restrict dy,
                                            const float* __restrict w, float rstd, float* __restrict g,
                                            float* __restrict dx, float* __restrict dw, float* __restrict db,
                                            int64_t n) {
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

// The attention's layout changes, fused with RoPE (half-split rotation, as
// DecoderModel::Rope). Rows of [N, T, D] (heads side by side) go to and from
// [N * H, T, dh] (one matrix per head, what the batched GEMMs read).
struct Heads {
  int64_t N = 0, T = 0, D = 0, H = 0, dh = 0;
  int64_t ld = 0;          // the row stride of the [N, T, ...] side (D, or 3 D for q, k and v side by side)
  int64_t per_member = 1;  // sequences per member (B): the bias is member n / B's
  const float *cos = nullptr, *sin = nullptr;  // [T, dh / 2]
};

// dst[n * H + h, t] = rope(src[n, t, h dh : (h + 1) dh] + bias[n / B, h dh :
// (h + 1) dh]) (a plain copy when `rotate` is false). `bias` rows are
// `bias_ld` apart (0: one row for every member).
CIRCUITLAB_CPU_CLONES void SplitHeads(const Heads& a, const float* __restrict src, const float* __restrict bias,
                                      int64_t bias_ld, float* __restrict dst, bool rotate) {
  const int64_t half = a.dh / 2;
  for (int64_t n = 0; n < a.N; ++n) {
    const float* bn = bias + (n / a.per_member) * bias_ld;
    for (int64_t t = 0; t < a.T; ++t) {
      const float *c = a.cos + t * half, *s = a.sin + t * half;
      for (int64_t h = 0; h < a.H; ++h) {
        const float* x = src + (n * a.T + t) * a.ld + h * a.dh;
        const float* bh = bn + h * a.dh;
        float* y = dst + ((n * a.H + h) * a.T + t) * a.dh;
        if (!rotate) {
          for (int64_t i = 0; i < a.dh; ++i) y[i] = x[i] + bh[i];
          continue;
        }
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i] + bh[i], x2 = x[half + i] + bh[half + i];
          y[i] = x1 * c[i] - x2 * s[i];
          y[half + i] = x1 * s[i] + x2 * c[i];
        }
      }
    }
  }
}

// The transpose (without the bias): dst[n, t, h dh : (h + 1) dh] =
// rope^T(src[n * H + h, t]), dst's rows a.ld apart.
CIRCUITLAB_CPU_CLONES void MergeHeads(const Heads& a, const float* __restrict src, float* __restrict dst, bool rotate) {
  const int64_t half = a.dh / 2;
  for (int64_t n = 0; n < a.N; ++n) {
    for (int64_t t = 0; t < a.T; ++t) {
      const float *c = a.cos + t * half, *s = a.sin + t * half;
      for (int64_t h = 0; h < a.H; ++h) {
        const float* x = src + ((n * a.H + h) * a.T + t) * a.dh;
        float* y = dst + (n * a.T + t) * a.ld + h * a.dh;
        if (!rotate) {
          for (int64_t i = 0; i < a.dh; ++i) y[i] = x[i];
          continue;
        }
        for (int64_t i = 0; i < half; ++i) {
          y[i] = x[i] * c[i] + x[half + i] * s[i];
          y[half + i] = -x[i] * s[i] + x[half + i] * c[i];
        }
      }
    }
  }
}

// Row maximum with eight partial results (vectorised).
[[gnu::always_inline]] inline float MaxBody(const float* x, int64_t n) {
  float acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = x[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  }
  float m = x[0];
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int k = 0; k < 8; ++k) m = acc[k] > m ? acc[k] : m;
  return m;
}

// In place on `count` [T, T] score matrices: row t becomes the softmax of
// scale * its first t + 1 entries, zeros after (the causal mask).
CIRCUITLAB_CPU_CLONES void CausalSoftmax(float* __restrict s, int64_t count, int64_t T, float scale) {
  for (int64_t m = 0; m < count; ++m) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = s + (m * T + t) * T;
      const int64_t n = t + 1;
      for (int64_t j = 0; j < n; ++j) row[j] *= scale;
      const float mx = MaxBody(row, n);
      for (int64_t j = 0; j < n; ++j) row[j] = ExpApprox(row[j] - mx);
      const float inv = 1.0f / SumBody(row, n);
      for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      for (int64_t j = n; j < T; ++j) row[j] = 0.0f;
    }
  }
}

// In place: the probabilities' gradient g becomes the scores' (the scale
// included): p (g - p . g) scale, zero where p is (above the diagonal).
CIRCUITLAB_CPU_CLONES void CausalSoftmaxBackward(const float* __restrict p, float* __restrict g, int64_t count,
                                                 int64_t T, float scale) {
  for (int64_t m = 0; m < count; ++m) {
    for (int64_t t = 0; t < T; ++t) {
      const float* prow = p + (m * T + t) * T;
      float* grow = g + (m * T + t) * T;
      const int64_t n = t + 1;
      const float dot = DotBody(prow, grow, n);
      for (int64_t j = 0; j < n; ++j) grow[j] = prow[j] * (grow[j] - dot) * scale;
      for (int64_t j = n; j < T; ++j) grow[j] = 0.0f;
    }
  }
}

// Next-token cross-entropy of one sequence: logits [T, V] (rows V apart),
// tokens [T]; returns the sum over positions t < T - 1 of logsumexp(x_t) -
// x_t[tokens[t + 1]], and writes each position's logsumexp to lse.
CIRCUITLAB_CPU_CLONES float NextTokenRow(const float* __restrict x, const int64_t* __restrict tokens, int64_t T,
                                         int64_t V, float* __restrict lse) {
  float total = 0.0f;
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* row = x + t * V;
    const float m = MaxBody(row, V);
    float acc[8] = {};
    int64_t j = 0;
    for (; j + 8 <= V; j += 8) {
      for (int k = 0; k < 8; ++k) acc[k] += ExpApprox(row[j + k] - m);
    }
    float sum = 0.0f;
    for (; j < V; ++j) sum += ExpApprox(row[j] - m);
    for (int k = 0; k < 8; ++k) sum += acc[k];
    lse[t] = m + std::log(sum);
    total += lse[t] - row[tokens[t + 1]];
  }
  return total;
}

// Its backward: dx_t = scale (softmax(x_t) - onehot(tokens[t + 1])) for
// t < T - 1, zero at the last position.
CIRCUITLAB_CPU_CLONES void NextTokenGradRow(const float* __restrict x, const int64_t* __restrict tokens,
                                            const float* __restrict lse, int64_t T, int64_t V, float scale,
                                            float* __restrict dx) {
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* row = x + t * V;
    float* d = dx + t * V;
    for (int64_t j = 0; j < V; ++j) d[j] = scale * ExpApprox(row[j] - lse[t]);
    d[tokens[t + 1]] -= scale;
  }
  for (int64_t j = 0; j < V; ++j) dx[(T - 1) * V + j] = 0.0f;
}

// [E, rows, width] views of a tensor [E, ..., width] and its member's rows.
int64_t RowsPerMember(const torch::Tensor& x) { return x.numel() / (x.size(0) * x.size(-1)); }

class BiasActivationFn : public torch::autograd::Function<BiasActivationFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h_in,
                               const torch::Tensor& bias_in, int64_t act) {
    const torch::Tensor h = h_in.contiguous(), bias = bias_in.contiguous();
    const int64_t E = h.size(0), F = h.size(-1), N = RowsPerMember(h);
    torch::Tensor y = torch::empty_like(h);
    const float *hp = h.data_ptr<float>(), *bp = bias.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < N; ++r) {
        const int64_t off = (e * N + r) * F;
        if (act == static_cast<int64_t>(MlpActivation::kSilu)) {
          SiluRow(hp + off, bp + e * F, yp + off, F);
        } else {
          GeluRow(hp + off, bp + e * F, yp + off, F);
        }
      }
    }
    ctx->save_for_backward({h, bias});
    ctx->saved_data["act"] = act;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor &h = saved[0], &bias = saved[1];
    const int64_t act = ctx->saved_data["act"].toInt();
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t E = h.size(0), F = h.size(-1), N = RowsPerMember(h);
    torch::Tensor dz = torch::empty_like(h), db = torch::zeros({E, F}, h.options());
    const float *hp = h.data_ptr<float>(), *bp = bias.data_ptr<float>(), *gp = dy.data_ptr<float>();
    float *dzp = dz.data_ptr<float>(), *dbp = db.data_ptr<float>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < N; ++r) {
        const int64_t off = (e * N + r) * F;
        if (act == static_cast<int64_t>(MlpActivation::kSilu)) {
          SiluGradRow(hp + off, bp + e * F, gp + off, dzp + off, dbp + e * F, F);
        } else {
          GeluGradRow(hp + off, bp + e * F, gp + off, dzp + off, dbp + e * F, F);
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

// The GEMMs are LibTorch's batched ones (one [T, T] or [T, dh] product per
// head); what the node fuses is everything around them: RoPE and the
// layout changes in one pass each way, the scale, the causal mask and the
// softmax in one pass over the scores, and the backward of each.
class CausalAttentionFn : public torch::autograd::Function<CausalAttentionFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv_in,
                               const torch::Tensor& bias_in, const torch::Tensor& cos, const torch::Tensor& sin,
                               int64_t heads) {
    const torch::Tensor qkv = qkv_in.contiguous();
    Heads a = Layout(qkv.size(0), qkv.size(1), qkv.size(2), qkv.size(3) / 3, heads, cos, sin);
    a.ld = 3 * a.D;
    // No bias: a zero row read by every member.
    const bool has_bias = bias_in.numel() > 0;
    const torch::Tensor bias = has_bias ? bias_in.contiguous() : torch::zeros({3 * a.D}, qkv.options());
    const int64_t bias_ld = has_bias ? 3 * a.D : 0;
    const float *src = qkv.data_ptr<float>(), *bp = bias.data_ptr<float>();
    torch::Tensor qh = torch::empty({a.N * a.H, a.T, a.dh}, qkv.options()), kh = torch::empty_like(qh),
                  vh = torch::empty_like(qh);
    SplitHeads(a, src, bp, bias_ld, qh.data_ptr<float>(), true);
    SplitHeads(a, src + a.D, bp + a.D, bias_ld, kh.data_ptr<float>(), true);
    SplitHeads(a, src + 2 * a.D, bp + 2 * a.D, bias_ld, vh.data_ptr<float>(), false);
    torch::Tensor p = at::bmm(qh, kh.transpose(1, 2));  // [N H, T, T]
    CausalSoftmax(p.data_ptr<float>(), a.N * a.H, a.T, Scale(a));
    const torch::Tensor o = at::bmm(p, vh);  // [N H, T, dh]
    torch::Tensor out = torch::empty({qkv.size(0), qkv.size(1), a.T, a.D}, qkv.options());
    a.ld = a.D;
    MergeHeads(a, o.data_ptr<float>(), out.data_ptr<float>(), false);
    ctx->save_for_backward({qh, kh, vh, p, cos, sin});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["bias"] = has_bias;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor &qh = saved[0], &kh = saved[1], &vh = saved[2], &p = saved[3];
    const torch::Tensor dout = grads[0].contiguous();  // [E, B, T, D]
    const int64_t E = dout.size(0), B = dout.size(1);
    Heads a = Layout(E, B, dout.size(2), dout.size(3), ctx->saved_data["heads"].toInt(), saved[4], saved[5]);
    a.ld = a.D;
    torch::Tensor doh = torch::empty_like(qh);
    const torch::Tensor zero = torch::zeros({a.D}, dout.options());
    SplitHeads(a, dout.data_ptr<float>(), zero.data_ptr<float>(), 0, doh.data_ptr<float>(), false);
    torch::Tensor ds = at::bmm(doh, vh.transpose(1, 2));  // d p, then d scores in place
    const torch::Tensor dvh = at::bmm(p.transpose(1, 2), doh);
    CausalSoftmaxBackward(p.data_ptr<float>(), ds.data_ptr<float>(), a.N * a.H, a.T, Scale(a));
    const torch::Tensor dqh = at::bmm(ds, kh), dkh = at::bmm(ds.transpose(1, 2), qh);
    torch::Tensor dqkv = torch::empty({E, B, a.T, 3 * a.D}, dout.options());
    a.ld = 3 * a.D;
    float* dst = dqkv.data_ptr<float>();
    MergeHeads(a, dqh.data_ptr<float>(), dst, true);
    MergeHeads(a, dkh.data_ptr<float>(), dst + a.D, true);
    MergeHeads(a, dvh.data_ptr<float>(), dst + 2 * a.D, false);
    torch::Tensor dbias = ctx->saved_data["bias"].toBool() ? dqkv.view({E, B * a.T, 3 * a.D}).sum(1) : torch::Tensor();
    return {dqkv, dbias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

 private:
  static Heads Layout(int64_t E, int64_t B, int64_t T, int64_t D, int64_t heads, const torch::Tensor& cos,
                      const torch::Tensor& sin) {
    Heads a;
    a.N = E * B;
    a.per_member = B;
    a.T = T;
    a.D = D;
    a.H = heads;
    a.dh = D / heads;
    a.cos = cos.data_ptr<float>();
    a.sin = sin.data_ptr<float>();
    return a;
  }
  static float Scale(const Heads& a) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.dh))); }
};

class NextTokenFn : public torch::autograd::Function<NextTokenFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits_in,
                               const torch::Tensor& tokens_in) {
    const torch::Tensor logits = logits_in.contiguous(), tokens = tokens_in.contiguous();
    const int64_t T = tokens.size(-1), V = logits.size(-1), R = tokens.numel() / T;
    std::vector<int64_t> shape = tokens.sizes().vec();
    shape.pop_back();
    torch::Tensor out = torch::empty(shape, logits.options()), lse = torch::empty({R, T}, logits.options());
    const float* xp = logits.data_ptr<float>();
    const int64_t* tp = tokens.data_ptr<int64_t>();
    float *op = out.data_ptr<float>(), *lp = lse.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r) {
      op[r] = NextTokenRow(xp + r * T * V, tp + r * T, T, V, lp + r * T) / static_cast<float>(T - 1);
    }
    ctx->save_for_backward({logits, tokens, lse});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor &logits = saved[0], &tokens = saved[1], &lse = saved[2];
    const torch::Tensor g = grads[0].contiguous();
    const int64_t T = tokens.size(-1), V = logits.size(-1), R = tokens.numel() / T;
    torch::Tensor dx = torch::empty_like(logits);
    const float *xp = logits.data_ptr<float>(), *lp = lse.data_ptr<float>(), *gp = g.data_ptr<float>();
    const int64_t* tp = tokens.data_ptr<int64_t>();
    float* dp = dx.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r) {
      NextTokenGradRow(xp + r * T * V, tp + r * T, lp + r * T, T, V, gp[r] / static_cast<float>(T - 1), dp + r * T * V);
    }
    return {dx, torch::Tensor()};
  }
};

std::atomic<bool> fused_kernels_enabled{true};

bool Supported(const torch::Tensor& x) { return x.device().is_cpu() && x.scalar_type() == torch::kFloat; }

}  // namespace

bool FusedKernelsApply(const torch::Tensor& x) {
  return fused_kernels_enabled.load(std::memory_order_relaxed) && Supported(x);
}

void SetFusedKernelsEnabled(bool enabled) { fused_kernels_enabled.store(enabled); }

torch::Tensor BiasActivation(const torch::Tensor& h, const torch::Tensor& bias, MlpActivation act) {
  TORCH_CHECK(Supported(h) && Supported(bias), "BiasActivation: float32 CPU tensors only");
  TORCH_CHECK(bias.dim() == 2 && h.size(0) == bias.size(0) && h.size(-1) == bias.size(1),
              "BiasActivation: bias must be [E, F] for h [E, ..., F]");
  return BiasActivationFn::apply(h, bias, static_cast<int64_t>(act));
}

torch::Tensor MemberLayerNorm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, double eps) {
  TORCH_CHECK(Supported(x) && Supported(w) && Supported(b), "MemberLayerNorm: float32 CPU tensors only");
  TORCH_CHECK(w.dim() == 2 && w.sizes() == b.sizes() && x.size(0) == w.size(0) && x.size(-1) == w.size(1),
              "MemberLayerNorm: w and b must be [E, D] for x [E, ..., D]");
  return MemberLayerNormFn::apply(x, w, b, eps);
}

torch::Tensor CausalAttention(const torch::Tensor& qkv, const torch::Tensor& bias, const torch::Tensor& cos,
                              const torch::Tensor& sin, int64_t heads) {
  TORCH_CHECK(Supported(qkv) && Supported(cos) && Supported(sin) && (!bias.defined() || Supported(bias)),
              "CausalAttention: float32 CPU tensors only");
  TORCH_CHECK(qkv.dim() == 4 && qkv.size(3) % 3 == 0, "CausalAttention: qkv must be [E, B, T, 3 D]");
  const int64_t T = qkv.size(2), D = qkv.size(3) / 3;
  TORCH_CHECK(!bias.defined() || (bias.dim() == 2 && bias.size(0) == qkv.size(0) && bias.size(1) == 3 * D),
              "CausalAttention: the bias must be [E, 3 D]");
  TORCH_CHECK(heads > 0 && D % heads == 0 && (D / heads) % 2 == 0,
              "CausalAttention: the heads must split D into even widths");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) >= T && cos.size(1) == D / heads / 2 && sin.sizes() == cos.sizes(),
              "CausalAttention: cos and sin must be [>= T, D / heads / 2]");
  const torch::Tensor c = cos.narrow(0, 0, T).contiguous(), s = sin.narrow(0, 0, T).contiguous();
  // An empty tensor for no bias: apply() takes defined tensors only.
  return CausalAttentionFn::apply(qkv, bias.defined() ? bias : torch::empty({0}, qkv.options()), c, s, heads);
}

torch::Tensor NextTokenCrossEntropy(const torch::Tensor& logits, const torch::Tensor& tokens) {
  TORCH_CHECK(Supported(logits) && tokens.scalar_type() == torch::kLong && tokens.device().is_cpu(),
              "NextTokenCrossEntropy: float32 logits and int64 tokens on the CPU only");
  TORCH_CHECK(tokens.dim() >= 1 && logits.dim() == tokens.dim() + 1 &&
                  logits.sizes().slice(0, tokens.dim()) == tokens.sizes() && tokens.size(-1) >= 2,
              "NextTokenCrossEntropy: logits must be tokens' shape + [V], with at least 2 positions");
  const int64_t V = logits.size(-1);
  TORCH_CHECK(tokens.numel() == 0 || (tokens.min().item<int64_t>() >= 0 && tokens.max().item<int64_t>() < V),
              "NextTokenCrossEntropy: a token outside [0, ", V, ")");
  return NextTokenFn::apply(logits, tokens);
}

}  // namespace circuitlab::engine
