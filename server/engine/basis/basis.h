// The IMIR basis (SCIENCE.md C.2, C.3 as corrected by G.1/G.5), derived from
// the symmetry group a task declares. Torch-free.
//
// Every trainable matrix of the block-residual model is a grid of blocks:
// key-query matrix W_l (one per head) has (H+1)^(l-1) x (H+1)^(l-1) blocks of
// d0 x d0, the readout has 1 x (H+1)^L blocks of V x d0. Because the task's
// symmetry group acts the same way on every block, the invariant subspace is,
// block by block, the span of a fixed set of "selection" elements:
//
//   complete  the commutant of the group: one 0/1 matrix per orbit of the
//             group on index pairs (token pairs under relabelling, position
//             pairs under cyclic shifts, mixed pairs). Orbitals partition the
//             block, so they are mutually orthogonal.
//   paper     the small named set {I_t, C, S_0..S_{k-1}} (KQ) and {I, C}
//             (readout): I_t is the identity on the tokens seen in training
//             (held-out excluded, G.5), C the association map, S_r the
//             position shift "attend r back". Also disjoint 0/1 matrices.
//
// So within a block both sets are disjoint supports ("parts"): projecting a
// matrix is a mean over each part, and the Gram matrix is diagonal (the part
// sizes). Blocks are orthogonal to each other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace circuitlab::engine {

// The symmetry group a task declares.
struct TaskSymmetry {
  // Token classes: token_class[t] in [0, class_names.size()). Tokens of one
  // class are exchangeable (relabelling them is a symmetry of the data).
  std::vector<int> token_class;
  std::vector<std::string> class_names;
  // partner[t] = C(t) for tokens in a fixed relation (-1 otherwise). The
  // relabelling group preserves it.
  std::vector<int> partner;
  // Tokens never seen in training (excluded from the paper set's I_t).
  std::vector<bool> heldout;
  int64_t positions = 0;  // P
  bool cyclic_positions = true;  // the cyclic shift group acts on ids (else no position symmetry)
  // The paper set's position shifts S_r ("attend r back"; -1 = one forward,
  // the backward-in-block selection of A.1.6). Default S_0, S_1 (k = 2).
  std::vector<int64_t> paper_shifts = {0, 1};
  int64_t vocab() const { return static_cast<int64_t>(token_class.size()); }
  int64_t d0() const { return vocab() + positions; }
  // Equal symmetries give equal bases.
  bool operator==(const TaskSymmetry&) const = default;
};

enum class Selection { kPaper = 0, kComplete = 1 };
const char* SelectionName(Selection s);

// A partition (possibly partial) of a rows x cols block into named parts.
struct BlockParts {
  int64_t rows = 0, cols = 0;
  std::vector<int32_t> part;  // rows*cols, row-major; -1 = in no part
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  std::vector<bool> gauge;  // parts that never change the model's function
};

// Parts of one d0 x d0 key-query block (rows: query coordinates, columns: key
// coordinates) and of one V x d0 readout block.
BlockParts KeyQueryParts(const TaskSymmetry& sym, Selection selection);
BlockParts ReadoutParts(const TaskSymmetry& sym, Selection selection);

// One coordinate: a part of one block of one matrix.
struct CoordinateDef {
  int32_t index = 0;       // position in Basis::coords
  std::string label;       // e.g. "L2H1:[∅→(1,0)]:I_t", "OUT:[(0,1)]:I"
  std::string canonical;   // "alpha", "beta", "gamma", "delta" or ""
  std::string matrix;      // "L2H1", "OUT"
  int layer = 0;           // 1..L; 0 for the readout
  int head = 0;            // 1..H; 0 for the readout
  std::string block_q;     // path of the query block ("∅", "(1,0)"); "" for the readout
  std::string block_k;     // path of the key / read block
  std::string element;     // part name, e.g. "S_1", "I[rare]"
  double norm = 0;         // Frobenius norm of the 0/1 element (sqrt of its size)
  bool gauge = false;
};

struct Basis {
  Selection selection = Selection::kPaper;
  int64_t layers = 0, heads = 0;
  BlockParts kq;        // the same parts for every key-query block
  BlockParts readout;   // the same parts for every readout block
  std::vector<CoordinateDef> coords;
};

// Coordinates in order: layer 1..L, head 1..H, query block, key block, part;
// then readout blocks, part. Paths are written with L entries, zeros for
// layers not taken ("∅" when all are zero); the block written by head h of
// layer l sits at offset h (H+1)^(l-1) d0.
Basis BuildBasis(const TaskSymmetry& sym, int64_t layers, int64_t heads, Selection selection);

// How many coordinates BuildBasis would make, without making them (the
// parts of one key-query and one readout block times the block counts).
// Touches d0^2 + V d0 entries: bound d0 first.
int64_t BasisSize(const TaskSymmetry& sym, int64_t layers, int64_t heads, Selection selection);

// The coordinate with this label or canonical name (alpha, beta, gamma,
// delta), or -1.
int32_t FindCoordinate(const Basis& basis, const std::string& name);

// "(h_1,...,h_L)" or "∅" for the block at `index` of a layer-`depth` residual.
std::string PathName(int64_t index, int64_t depth, int64_t layers, int64_t heads);

}  // namespace circuitlab::engine
