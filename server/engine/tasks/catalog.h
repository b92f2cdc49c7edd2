// The task catalogue, torch-free: for every task family of spec.proto its
// name, sequence shape and declared symmetry group (SCIENCE.md A.1). The
// scheduler validates coordinate names against the basis this symmetry
// yields; the generators (tasks/*.cc, LibTorch) take their layout from here
// so shape and symmetry are stated once.
//
// Every block-list task shares the vocabulary head [FILL(=BOS), SEP, QRY,
// GIVE] followed by its own token classes.
#pragma once

#include <cstdint>
#include <string>

#include "circuitlab/v1/spec.pb.h"
#include "server/engine/basis/basis.h"

namespace circuitlab::engine {

inline constexpr int64_t kNumSpecials = 4;

// Vocabulary size V, position vocabulary P and sequence length T of a
// resolved spec's task.
struct TaskShape {
  int64_t vocab = 0;
  int64_t positions = 0;
  int64_t seq_len = 0;
};
TaskShape ShapeOf(const v1::ExperimentSpec& resolved);

// "associative_recall", "k_hop", "ngram", "ioi", "conditional_retrieval",
// "permutation_inversion", "minimal_icl", "latent".
std::string TaskName(const v1::TaskSpec& task);

// Output width of a resolved latent task: S states, plus the up and down
// symbols for DYCK; 1 (the scalar prediction of y) for REGRESSION.
int64_t LatentVocab(const v1::LatentTask& task);

// The symmetry group of the task's data (block-list tasks only): token classes (exchangeable tokens),
// the fixed relation, held-out tokens, the position group and the paper set's
// shifts. For associative recall the relation pairs common tokens in a
// placeholder order (coordinate labels do not depend on which pairs); a task
// pool replaces it with its own pairing.
TaskSymmetry DeclaredSymmetry(const v1::ExperimentSpec& resolved);

// The associative-recall layout [specials | common | rare | held-out] with the
// placeholder pairing (DeclaredSymmetry uses it; the generator replaces the
// pairing with its pool's).
TaskSymmetry AssocRecallSymmetry(int64_t num_common, int64_t num_rare, int64_t num_heldout, int64_t block_length,
                                 int64_t positions, bool absolute_positions);

}  // namespace circuitlab::engine
