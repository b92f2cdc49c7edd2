#include "server/engine/models/imir_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "server/engine/models/cpu_clones.h"

namespace circuitlab::engine {
namespace {

// The two vector primitives the per-sequence products run on, compiled for
// AVX2+FMA and the baseline (cpu_clones.h).

CIRCUITLAB_CPU_CLONES float Dot(const float* a, const float* b, int64_t n) { return DotBody(a, b, n); }
CIRCUITLAB_CPU_CLONES double Dot(const double* a, const double* b, int64_t n) { return DotBody(a, b, n); }
CIRCUITLAB_CPU_CLONES void Axpy(float alpha, const float* x, float* y, int64_t n) { AxpyBody(alpha, x, y, n); }
CIRCUITLAB_CPU_CLONES void Axpy(double alpha, const double* x, double* y, int64_t n) { AxpyBody(alpha, x, y, n); }

// p[0..n) <- softmax(p[0..n)).
template <typename S>
void Softmax(S* p, int64_t n) {
  const S m = *std::max_element(p, p + n);
  S sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(p[i] - m);
    sum += p[i];
  }
  const S inv = S(1) / sum;
  for (int64_t i = 0; i < n; ++i) p[i] *= inv;
}

// g[0..n) <- the score gradient, given the probabilities a and the gradient
// g with respect to them.
template <typename S>
void SoftmaxBackward(const S* a, S* g, int64_t n) {
  S dot = 0;
  for (int64_t i = 0; i < n; ++i) dot += a[i] * g[i];
  for (int64_t i = 0; i < n; ++i) g[i] = a[i] * (g[i] - dot);
}

// Sizes, and what the forward keeps for the backward. Layer l (0-based)
// reads x[l] ([E, B, T, d_l]; x[0] is the one-hot input, never stored) and
// computes `rows(l)` query rows from position first(l): every position below
// the last layer, the query alone at it. Its output rows are x[l+1], or xq
// ([E, B, d_L]) after the last layer.
//
// Two layers (`fused()`): x[1] is not stored but for its query row
// ([E, B, 1, d_1]); the last layer rebuilds each sequence's rows from the
// first layer's attention into a buffer that stays in the cache, and the
// backward runs both layers per sequence there. (Storing x[1] and its
// gradient streams T x d_1 floats per sequence through memory four times a
// step, which cost more than the arithmetic at the bench's medium sizes.)
struct Pass {
  int64_t E = 0, B = 0, T = 0, V = 0, H = 0, L = 0;
  std::vector<int64_t> d;
  torch::Tensor tokens, pids;      // [E, B, T]
  std::vector<torch::Tensor> x;    // x[0] empty; x[1] holds only the query row when fused
  std::vector<torch::Tensor> q;    // q[l], l >= 1: [E, B, rows, H * d_l]
  std::vector<torch::Tensor> att;  // [E, B, H, rows, T]
  torch::Tensor xq;                // [E, B, d_L]
  // The tensors' data, read once (data_ptr's checks cost ~2% of a step when
  // called per row): Bind() after any of the tensors above is (re)assigned.
  const int64_t *tok_data = nullptr, *pid_data = nullptr;
  std::vector<void*> x_data, q_data, att_data;
  void* xq_data = nullptr;

  void Bind() {
    tok_data = tokens.data_ptr<int64_t>();
    pid_data = pids.data_ptr<int64_t>();
    x_data.clear();
    q_data.clear();
    att_data.clear();
    for (const torch::Tensor& t : x) x_data.push_back(t.data_ptr());
    for (const torch::Tensor& t : q) q_data.push_back(t.data_ptr());
    for (const torch::Tensor& t : att) att_data.push_back(t.data_ptr());
    xq_data = xq.data_ptr();
  }

  // Zeroed activations (x[0] and q[0] stay empty: the first layer reads the
  // one-hot input and needs no query matrix).
  void Allocate(const torch::TensorOptions& opts) {
    x.assign(static_cast<size_t>(L), torch::empty({0}, opts));
    q.assign(static_cast<size_t>(L), torch::empty({0}, opts));
    for (int64_t l = 0; l < L; ++l) {
      if (l >= 1) x[l] = torch::zeros({E, B, stored_rows(l), d[l]}, opts);
      att.push_back(torch::zeros({E, B, H, rows(l), T}, opts));
    }
    xq = torch::zeros({E, B, d[L]}, opts);
  }

  int64_t rows(int64_t l) const { return l == L - 1 ? 1 : T; }
  int64_t first(int64_t l) const { return l == L - 1 ? T - 1 : 0; }
  bool fused() const { return L == 2; }
  int64_t stored_rows(int64_t l) const { return fused() && l == 1 ? 1 : T; }
  int64_t seq(int64_t e, int64_t b) const { return e * B + b; }

  // The one-hot columns of sequence (e, b): a[t] = token, c[t] = V + position.
  // The loops index W by them, so ids out of range are refused here (the
  // forward reads every sequence's columns before it writes anything; the
  // reference forward's scatter throws likewise).
  void Columns(int64_t e, int64_t b, std::vector<int64_t>* a, std::vector<int64_t>* c) const {
    const int64_t* tk = tok_data + seq(e, b) * T;
    const int64_t* pd = pid_data + seq(e, b) * T;
    const int64_t d0 = d[0];
    for (int64_t t = 0; t < T; ++t) {
      (*a)[t] = tk[t];
      (*c)[t] = V + pd[t];
      TORCH_CHECK(tk[t] >= 0 && tk[t] < V && pd[t] >= 0 && V + pd[t] < d0, "BlockQueryLogits: token ", tk[t],
                  " or position ", pd[t], " outside the one-hot input (", V, " tokens, ", d0 - V, " positions)");
    }
  }

  template <typename S>
  S* AttRow(int64_t l, int64_t e, int64_t b, int64_t h, int64_t r) const {
    return static_cast<S*>(att_data[l]) + ((seq(e, b) * H + h) * rows(l) + r) * T;
  }
  // Layer l's query rows' queries for sequence (e, b): rows x H d.
  template <typename S>
  const S* QueryOf(int64_t l, int64_t e, int64_t b) const {
    return static_cast<const S*>(q_data[l]) + seq(e, b) * rows(l) * H * d[l];
  }
  // The readout row of sequence (e, b): d_L.
  template <typename S>
  S* QueryOut(int64_t e, int64_t b) const {
    return static_cast<S*>(xq_data) + seq(e, b) * d[L];
  }
  // Layer l's stored input rows for sequence (e, b).
  template <typename S>
  S* InputRows(int64_t l, int64_t e, int64_t b) const {
    return static_cast<S*>(x_data[l]) + seq(e, b) * stored_rows(l) * d[l];
  }
};

// [E, H, d, d] -> [E, d, H * d]: the heads' matrices side by side, so that
// one GEMM gives every head's queries.
torch::Tensor SideBySide(const torch::Tensor& w) {
  const int64_t E = w.size(0), H = w.size(1), d = w.size(2);
  return H == 1 ? w.view({E, d, d}) : w.permute({0, 2, 1, 3}).reshape({E, d, H * d});
}

// The query rows of x[l] as one matrix per member: [E, B * rows, d].
torch::Tensor QueryRows(const Pass& p, int64_t l) {
  const int64_t from = p.stored_rows(l) == p.T ? p.first(l) : 0;
  return p.x[l].narrow(2, from, p.rows(l)).reshape({p.E, p.B * p.rows(l), p.d[l]});
}

// Row r (position t) of the first layer's output for one sequence, from its
// attention rows: [onehot | head 1 | ... | head H]. `out` is zeroed.
template <typename S>
void OneHotRow(const Pass& p, int64_t e, int64_t b, int64_t r, int64_t t, const std::vector<int64_t>& a,
               const std::vector<int64_t>& c, S* out) {
  const int64_t d0 = p.d[0];
  out[a[t]] = 1;
  out[c[t]] = 1;
  for (int64_t h = 0; h < p.H; ++h) {
    const S* s = p.AttRow<S>(0, e, b, h, r);
    S* y = out + (h + 1) * d0;
    for (int64_t j = 0; j <= t; ++j) {
      y[a[j]] += s[j];
      y[c[j]] += s[j];
    }
  }
}

// Every row of x[1] for one sequence into `X` (T x d_1, overwritten).
template <typename S>
void RebuildFirstRows(const Pass& p, int64_t e, int64_t b, const std::vector<int64_t>& a, const std::vector<int64_t>& c,
                      S* X) {
  std::memset(X, 0, sizeof(S) * p.T * p.d[1]);
  for (int64_t t = 0; t < p.T; ++t) OneHotRow(p, e, b, t, t, a, c, X + t * p.d[1]);
}

template <typename S>
void FirstLayerForward(Pass& p, const torch::Tensor& w) {
  const int64_t d0 = p.d[0], R = p.rows(0), t0 = p.first(0);
  const S* W = w.data_ptr<S>();
  std::vector<int64_t> a(p.T), c(p.T);
  for (int64_t e = 0; e < p.E; ++e) {
    for (int64_t b = 0; b < p.B; ++b) {
      p.Columns(e, b, &a, &c);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t t = t0 + r;
        for (int64_t h = 0; h < p.H; ++h) {
          const S* wa = W + ((e * p.H + h) * d0 + a[t]) * d0;
          const S* wc = W + ((e * p.H + h) * d0 + c[t]) * d0;
          S* s = p.AttRow<S>(0, e, b, h, r);
          for (int64_t j = 0; j <= t; ++j) s[j] = wa[a[j]] + wa[c[j]] + wc[a[j]] + wc[c[j]];
          Softmax(s, t + 1);
        }
        if (p.L == 1) {
          OneHotRow(p, e, b, r, t, a, c, p.QueryOut<S>(e, b));
        } else if (!p.fused()) {
          OneHotRow(p, e, b, r, t, a, c, p.InputRows<S>(1, e, b) + t * p.d[1]);
        } else if (t == p.T - 1) {
          OneHotRow(p, e, b, r, t, a, c, p.InputRows<S>(1, e, b));  // the query row alone
        }
      }
    }
  }
}

// Layer l >= 1 for one sequence whose input rows are X (T x d): its
// attention rows and its output rows `out` (rows x (H+1) d, zeroed).
template <typename S>
void DenseSequenceForward(const Pass& p, int64_t l, int64_t e, int64_t b, const S* X, S* out) {
  const int64_t d = p.d[l], R = p.rows(l), t0 = p.first(l), H = p.H;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = t0 + r;
    S* o = out + r * (H + 1) * d;
    std::memcpy(o, X + t * d, sizeof(S) * d);
    for (int64_t h = 0; h < H; ++h) {
      const S* qv = p.QueryOf<S>(l, e, b) + r * H * d + h * d;
      S* s = p.AttRow<S>(l, e, b, h, r);
      for (int64_t j = 0; j <= t; ++j) s[j] = Dot(qv, X + j * d, d);
      Softmax(s, t + 1);
      S* y = o + (h + 1) * d;
      for (int64_t j = 0; j <= t; ++j) Axpy(s[j], X + j * d, y, d);
    }
  }
}

template <typename S>
void DenseLayerForward(Pass& p, int64_t l, const torch::Tensor& w) {
  const int64_t d = p.d[l], R = p.rows(l), H = p.H;
  p.q[l] = at::bmm(QueryRows(p, l), SideBySide(w)).view({p.E, p.B, R, H * d});
  p.Bind();
  std::vector<int64_t> a(p.T), c(p.T);
  std::vector<S> rebuilt(p.fused() ? static_cast<size_t>(p.T * d) : 0);
  for (int64_t e = 0; e < p.E; ++e) {
    for (int64_t b = 0; b < p.B; ++b) {
      const S* X = p.InputRows<S>(l, e, b);
      if (p.fused()) {
        p.Columns(e, b, &a, &c);
        RebuildFirstRows(p, e, b, a, c, rebuilt.data());
        X = rebuilt.data();
      }
      S* out = l == p.L - 1 ? p.QueryOut<S>(e, b) : p.InputRows<S>(l + 1, e, b);
      DenseSequenceForward(p, l, e, b, X, out);
    }
  }
}

// The backward of DenseSequenceForward: dout (rows x (H+1) d) is the
// gradient of its output rows; adds the input rows' gradient to dX (T x d)
// and sets the query rows' gradient dq (rows x H d, zeroed).
template <typename S>
void DenseSequenceBackward(const Pass& p, int64_t l, int64_t e, int64_t b, const S* X, const S* dout, S* dX, S* dq,
                           std::vector<S>* scratch) {
  const int64_t d = p.d[l], R = p.rows(l), t0 = p.first(l), H = p.H;
  S* g = scratch->data();
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = t0 + r;
    const S* dr = dout + r * (H + 1) * d;
    Axpy(S(1), dr, dX + t * d, d);  // the row's own copy
    for (int64_t h = 0; h < H; ++h) {
      const S* qv = p.QueryOf<S>(l, e, b) + r * H * d + h * d;
      S* dqv = dq + r * H * d + h * d;
      const S* att = p.AttRow<S>(l, e, b, h, r);
      const S* dy = dr + (h + 1) * d;
      for (int64_t j = 0; j <= t; ++j) {
        g[j] = Dot(dy, X + j * d, d);
        Axpy(att[j], dy, dX + j * d, d);
      }
      SoftmaxBackward(att, g, t + 1);
      for (int64_t j = 0; j <= t; ++j) {
        Axpy(g[j], X + j * d, dqv, d);
        Axpy(g[j], qv, dX + j * d, d);
      }
    }
  }
}

// The weight gradient of layer l from its query rows' gradient dq
// ([E, B, rows, H d]), and the query rows' share of the input gradient added
// to dx_rows ([E, B, rows, d]).
torch::Tensor DenseWeightsBackward(const Pass& p, int64_t l, const torch::Tensor& w, const torch::Tensor& dq,
                                   torch::Tensor dx_rows) {
  const int64_t d = p.d[l], R = p.rows(l), H = p.H;
  const torch::Tensor dqm = dq.view({p.E, p.B * R, H * d});
  dx_rows.add_(at::bmm(dqm, SideBySide(w).transpose(1, 2)).view({p.E, p.B, R, d}));
  return at::bmm(QueryRows(p, l).transpose(1, 2), dqm).view({p.E, d, H, d}).permute({0, 2, 1, 3}).contiguous();
}

// The first layer's backward for one output row (position t): dout is the
// row's gradient ((H+1) d0; the one-hot part is ignored: the input is
// fixed). Scatters the score gradient into dW's four entries per key.
template <typename S>
void FirstRowBackward(const Pass& p, int64_t e, int64_t b, int64_t r, int64_t t, const std::vector<int64_t>& a,
                      const std::vector<int64_t>& c, const S* dout, S* dW, std::vector<S>* scratch) {
  const int64_t d0 = p.d[0];
  S* g = scratch->data();
  for (int64_t h = 0; h < p.H; ++h) {
    const S* dy = dout + (h + 1) * d0;
    const S* att = p.AttRow<S>(0, e, b, h, r);
    for (int64_t j = 0; j <= t; ++j) g[j] = dy[a[j]] + dy[c[j]];
    SoftmaxBackward(att, g, t + 1);
    S* wa = dW + ((e * p.H + h) * d0 + a[t]) * d0;
    S* wc = dW + ((e * p.H + h) * d0 + c[t]) * d0;
    for (int64_t j = 0; j <= t; ++j) {
      wa[a[j]] += g[j];
      wa[c[j]] += g[j];
      wc[a[j]] += g[j];
      wc[c[j]] += g[j];
    }
  }
}

// dnext: the gradient of the last layer's output rows, [E, B, 1, d_L].
// Fills the weight gradients dkq[l].
template <typename S>
void Backward(const Pass& p, const std::vector<torch::Tensor>& kq, torch::Tensor dnext,
              std::vector<torch::Tensor>* dkq) {
  const auto opts = kq[0].options();
  std::vector<int64_t> a(p.T), c(p.T);
  std::vector<S> scratch(p.T);
  torch::Tensor dw0 = torch::zeros_like(kq[0]);
  S* dW0 = dw0.data_ptr<S>();
  if (p.fused()) {
    // Per sequence: rebuild x[1], run the last layer's backward into a
    // cache-resident dX, then the first layer's backward for every row but
    // the query, whose gradient still lacks the query GEMM's share.
    const int64_t d = p.d[1];
    torch::Tensor dq = torch::zeros({p.E, p.B, 1, p.H * d}, opts);
    torch::Tensor dquery = torch::zeros({p.E, p.B, 1, d}, opts);
    std::vector<S> X(static_cast<size_t>(p.T * d)), dX(X.size());
    for (int64_t e = 0; e < p.E; ++e) {
      for (int64_t b = 0; b < p.B; ++b) {
        p.Columns(e, b, &a, &c);
        RebuildFirstRows(p, e, b, a, c, X.data());
        std::fill(dX.begin(), dX.end(), S(0));
        DenseSequenceBackward(p, 1, e, b, X.data(), dnext.data_ptr<S>() + p.seq(e, b) * p.d[2], dX.data(),
                              dq.data_ptr<S>() + p.seq(e, b) * p.H * d, &scratch);
        for (int64_t t = 0; t + 1 < p.T; ++t) FirstRowBackward(p, e, b, t, t, a, c, dX.data() + t * d, dW0, &scratch);
        std::memcpy(dquery.data_ptr<S>() + p.seq(e, b) * d, dX.data() + (p.T - 1) * d, sizeof(S) * d);
      }
    }
    (*dkq)[1] = DenseWeightsBackward(p, 1, kq[1], dq, dquery);
    for (int64_t e = 0; e < p.E; ++e) {
      for (int64_t b = 0; b < p.B; ++b) {
        p.Columns(e, b, &a, &c);
        FirstRowBackward(p, e, b, p.T - 1, p.T - 1, a, c, dquery.data_ptr<S>() + p.seq(e, b) * d, dW0, &scratch);
      }
    }
    (*dkq)[0] = dw0;
    return;
  }
  for (int64_t l = p.L - 1; l >= 1; --l) {
    const int64_t d = p.d[l], R = p.rows(l);
    torch::Tensor dx = torch::zeros({p.E, p.B, p.T, d}, opts);
    torch::Tensor dq = torch::zeros({p.E, p.B, R, p.H * d}, opts);
    for (int64_t e = 0; e < p.E; ++e) {
      for (int64_t b = 0; b < p.B; ++b) {
        DenseSequenceBackward(
            p, l, e, b, p.InputRows<S>(l, e, b), dnext.data_ptr<S>() + p.seq(e, b) * R * (p.H + 1) * d,
            dx.data_ptr<S>() + p.seq(e, b) * p.T * d, dq.data_ptr<S>() + p.seq(e, b) * R * p.H * d, &scratch);
      }
    }
    (*dkq)[l] = DenseWeightsBackward(p, l, kq[l], dq, dx.narrow(2, p.first(l), R));
    dnext = dx;
  }
  const int64_t R = p.rows(0), t0 = p.first(0), width = (p.H + 1) * p.d[0];
  for (int64_t e = 0; e < p.E; ++e) {
    for (int64_t b = 0; b < p.B; ++b) {
      p.Columns(e, b, &a, &c);
      for (int64_t r = 0; r < R; ++r) {
        FirstRowBackward(p, e, b, r, t0 + r, a, c, dnext.data_ptr<S>() + (p.seq(e, b) * R + r) * width, dW0, &scratch);
      }
    }
  }
  (*dkq)[0] = dw0;
}

class BlockQueryFn : public torch::autograd::Function<BlockQueryFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& tokens,
                               const torch::Tensor& pids, int64_t vocab, const torch::Tensor& readout,
                               at::TensorList kq_list) {
    Pass p = Plan(tokens, pids, vocab, readout, kq_list);
    p.Allocate(readout.options().requires_grad(false));
    p.Bind();
    const std::vector<torch::Tensor> kq(kq_list.begin(), kq_list.end());
    AT_DISPATCH_FLOATING_TYPES(readout.scalar_type(), "BlockQueryLogits", [&] {
      FirstLayerForward<scalar_t>(p, kq[0]);
      for (int64_t l = 1; l < p.L; ++l) DenseLayerForward<scalar_t>(p, l, kq[l]);
    });
    torch::Tensor logits = at::bmm(p.xq, readout.transpose(1, 2));  // [E, B, V]
    std::vector<torch::Tensor> saved = {tokens, pids, readout};
    saved.insert(saved.end(), kq.begin(), kq.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["x"] = p.x;
    ctx->saved_data["q"] = p.q;
    ctx->saved_data["att"] = p.att;
    ctx->saved_data["xq"] = p.xq;
    return logits;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const std::vector<torch::Tensor> kq(saved.begin() + 3, saved.end());
    const torch::Tensor& readout = saved[2];
    Pass p = Plan(saved[0], saved[1], ctx->saved_data["vocab"].toInt(), readout, kq);
    p.x = ctx->saved_data["x"].toTensorVector();
    p.q = ctx->saved_data["q"].toTensorVector();
    p.att = ctx->saved_data["att"].toTensorVector();
    p.xq = ctx->saved_data["xq"].toTensor();
    p.Bind();

    const torch::Tensor g = grads[0].contiguous();  // [E, B, V]
    torch::autograd::variable_list out(4 + static_cast<size_t>(p.L));
    out[3] = at::bmm(g.transpose(1, 2), p.xq);  // d readout: [E, V, d_L]
    torch::Tensor dnext = at::bmm(g, readout).view({p.E, p.B, 1, p.d[p.L]});
    std::vector<torch::Tensor> dkq(static_cast<size_t>(p.L));
    AT_DISPATCH_FLOATING_TYPES(readout.scalar_type(), "BlockQueryLogitsBackward",
                               [&] { Backward<scalar_t>(p, kq, dnext, &dkq); });
    for (int64_t l = 0; l < p.L; ++l) out[4 + l] = dkq[l];
    return out;
  }

 private:
  static Pass Plan(const torch::Tensor& tokens, const torch::Tensor& pids, int64_t vocab, const torch::Tensor& readout,
                   at::TensorList kq) {
    Pass p;
    p.tokens = tokens.contiguous();
    p.pids = pids.contiguous();
    p.E = tokens.size(0);
    p.B = tokens.size(1);
    p.T = tokens.size(2);
    p.V = vocab;
    p.L = static_cast<int64_t>(kq.size());
    p.H = kq[0].size(1);
    for (const torch::Tensor& w : kq) p.d.push_back(w.size(2));
    p.d.push_back(readout.size(2));
    return p;
  }
};

}  // namespace

// GCC 14 at -O3 inlines LibTorch's Function<>::apply here, with the
// std::vector<bool>::reserve it calls, and then reports -Warray-bounds and
// -Wstringop-overflow on a memmove inside libstdc++'s vector<bool>
// reallocation that cannot run (reserve on an empty vector). False
// positives; silenced for this one function on every compiler rather than
// switched off for the engine.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
torch::Tensor BlockQueryLogits(const torch::Tensor& tokens, const torch::Tensor& pids, int64_t vocab,
                               const std::vector<torch::Tensor>& kq, const torch::Tensor& readout) {
  TORCH_CHECK(!kq.empty() && tokens.dim() == 3 && tokens.sizes() == pids.sizes(), "BlockQueryLogits: bad shapes");
  TORCH_CHECK(readout.device().is_cpu(), "BlockQueryLogits runs on the CPU");
  std::vector<torch::Tensor> weights;
  for (const torch::Tensor& w : kq) weights.push_back(w.contiguous());
  return BlockQueryFn::apply(tokens, pids, vocab, readout.contiguous(), at::TensorList(weights));
}
#pragma GCC diagnostic pop

}  // namespace circuitlab::engine
