// CIRCUITLAB_CPU_CLONES: a function compiled twice, for AVX2+FMA (x86-64-v3)
// and for the baseline, and picked at load time by the CPU, as ATen picks its
// own kernels. The hand-written CPU kernels (imir_block, decoder_kernels) put
// it on their inner loops, which GCC vectorises in each clone.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CIRCUITLAB_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CIRCUITLAB_CPU_CLONES
#endif
