// The IMIR block model's logits at the query (last) position, forward and
// backward written by hand for the CPU (SCIENCE.md B.1; ImirModel's reference
// forward is the same math in ATen ops). Engine-private (includes LibTorch).
//
// What the structure buys:
//   - X0 is one-hot (a token column and a position column), so layer 1 needs
//     no matmul: its scores are sums of four gathered entries of W_1,
//     s_tj = W[a_t,a_j] + W[a_t,b_j] + W[b_t,a_j] + W[b_t,b_j], its head
//     output is a scatter of the attention row into two columns per key,
//     and its weight gradient a scatter of the score gradient back into
//     those four entries.
//   - the last layer is computed at the query only (all that is read out).
//   - forward and backward are one autograd node: the backward reuses the
//     saved attention rows and queries instead of replaying autograd's chain
//     of small ops.
// Layers between the first and the last are dense (their input is no longer
// one-hot): one GEMM per layer for the queries (ATen), the per-sequence
// score and copy products in loops.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace circuitlab::engine {

// tokens, pids: [E, B, T] int64 (token ids < vocab; position ids, offset by
// vocab in the one-hot input); kq[l]: [E, H, d_l, d_l], d_l = (H+1)^l d_0;
// readout: [E, V, d_L]; float or double on the CPU. Returns logits [E, B, V],
// differentiable with respect to kq and readout (first order).
torch::Tensor BlockQueryLogits(const torch::Tensor& tokens, const torch::Tensor& pids, int64_t vocab,
                               const std::vector<torch::Tensor>& kq, const torch::Tensor& readout);

}  // namespace circuitlab::engine
