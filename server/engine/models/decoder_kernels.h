// Fused CPU kernels of the decoder's training step (issue 37), each one
// autograd node with a hand-written backward. DecoderModel::Forward picks them
// for float32 tensors on the CPU when no hook reads the intermediate tensors
// (FusedKernelsApply); hooks, other dtypes and other devices keep the
// reference path of ATen ops, which computes the same math.
//
// What they replace, and why it pays (bench/RESULTS.md, "Fused decoder
// kernels"): Debian's LibTorch computes SiLU's and tanh-GELU's backward one
// element at a time (~17 ns an element, a fifth of a TV-small or B.2 step),
// and the per-member LayerNorm affine and bias adds are extra passes over the
// activations, forward and backward.
//
// Engine-private (includes LibTorch).
#pragma once

#include <torch/torch.h>

namespace circuitlab::engine {

enum class MlpActivation { kSilu, kGeluTanh };

// Whether the fused kernels take tensors like `x` (float32 on the CPU, and
// not switched off).
bool FusedKernelsApply(const torch::Tensor& x);

// Process-wide switch, on by default: off, every forward takes the reference
// ops (decoder_train_bench --reference-ops measures both in one run).
void SetFusedKernelsEnabled(bool enabled);

// act(h + bias) for h [E, ..., F] and a per-member bias [E, F]: the MLP's
// first linear map's bias and activation in one pass. The node saves h and
// the bias and recomputes the activation's derivative from them.
torch::Tensor BiasActivation(const torch::Tensor& h, const torch::Tensor& bias, MlpActivation act);

// LayerNorm over the last dimension with a per-member gain and bias:
// (x - mean) / sqrt(var + eps) * w + b for x [E, ..., D], w, b [E, D]. The
// node saves the normalised x and 1 / sqrt(var + eps) per row.
torch::Tensor MemberLayerNorm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                              double eps = 1e-5);

// Causal softmax attention with RoPE on q and k, all heads. qkv
// [E, B, T, 3 D]: the q, k and v maps' outputs side by side (one GEMM with
// the three weights concatenated), head h of each in columns [h dh, (h + 1)
// dh) of its third; bias: [E, 3 D] or undefined (added before RoPE); cos,
// sin [>= T, dh / 2] (DecoderModel's tables). Returns the heads' outputs
// side by side, [E, B, T, D], what W_O reads.
// The products are LibTorch's batched GEMMs; the bias, RoPE and the change
// of layout, and the scale, causal mask and softmax, are one pass each,
// forward and backward. The node saves the rotated q and k, v and the
// probabilities (as the reference's softmax does).
torch::Tensor CausalAttention(const torch::Tensor& qkv, const torch::Tensor& bias, const torch::Tensor& cos,
                              const torch::Tensor& sin, int64_t heads);

// The mean next-token cross-entropy of each sequence: logits [..., T, V],
// tokens [..., T] (int64, in [0, V)); returns [...], the mean over t < T - 1
// of -log softmax(logits[t])[tokens[t + 1]], the positions whose next token
// is known. One pass per sequence each way (the node saves the logits and
// each position's logsumexp).
torch::Tensor NextTokenCrossEntropy(const torch::Tensor& logits, const torch::Tensor& tokens);

}  // namespace circuitlab::engine
