// CIRCUITLAB_CPU_CLONES: a function compiled twice, for AVX2+FMA (x86-64-v3)
// and for the baseline, and picked at load time by the CPU, as ATen picks its
// own kernels. The hand-written CPU kernels (imir_block, decoder_kernels) put
// it on their inner loops, which GCC vectorises in each clone.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CIRCUITLAB_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CIRCUITLAB_CPU_CLONES
#endif

namespace circuitlab::engine {

// The vector bodies the kernels' loops inline (always_inline, so each clone
// vectorises them for its own target).

// a . b with eight independent partial sums: the compiler vectorises this
// without reassociating a single sum.
template <typename S>
[[gnu::always_inline]] inline S DotBody(const S* a, const S* b, int64_t n) {
  S acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  S s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int k = 0; k < 8; ++k) s += acc[k];
  return s;
}

// y += alpha x.
template <typename S>
[[gnu::always_inline]] inline void AxpyBody(S alpha, const S* x, S* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace circuitlab::engine
