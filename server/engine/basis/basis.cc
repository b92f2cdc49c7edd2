#include "server/engine/basis/basis.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace circuitlab::engine {
namespace {

// Collects parts by name in first-seen order.
class PartBuilder {
 public:
  PartBuilder(int64_t rows, int64_t cols) {
    parts_.rows = rows;
    parts_.cols = cols;
    parts_.part.assign(static_cast<size_t>(rows * cols), -1);
  }
  void Add(int64_t r, int64_t c, const std::string& name, bool gauge = false) {
    auto [it, inserted] = ids_.emplace(name, static_cast<int32_t>(parts_.names.size()));
    if (inserted) {
      parts_.names.push_back(name);
      parts_.sizes.push_back(0);
      parts_.gauge.push_back(gauge);
    }
    parts_.part[static_cast<size_t>(r * parts_.cols + c)] = it->second;
    parts_.sizes[it->second]++;
  }
  BlockParts Take() { return std::move(parts_); }

 private:
  BlockParts parts_;
  std::map<std::string, int32_t> ids_;
};

// The orbit of a token pair under relabellings that preserve the classes and
// the relation: same token, partners, other pair within a class, or a pair of
// classes.
std::string TokenPairOrbit(const TaskSymmetry& s, int64_t x, int64_t y) {
  const std::string& cx = s.class_names[s.token_class[x]];
  if (s.token_class[x] != s.token_class[y]) return "J[" + cx + "," + s.class_names[s.token_class[y]] + "]";
  if (x == y) return "I[" + cx + "]";
  if (s.partner[x] == y) return "C[" + cx + "]";
  return "O[" + cx + "]";
}

std::string Num(int64_t v) { return std::to_string(v); }

}  // namespace

const char* SelectionName(Selection s) { return s == Selection::kPaper ? "paper" : "complete"; }

BlockParts KeyQueryParts(const TaskSymmetry& s, Selection selection) {
  const int64_t V = s.vocab(), P = s.positions, d0 = s.d0();
  PartBuilder b(d0, d0);
  for (int64_t r = 0; r < d0; ++r) {
    for (int64_t c = 0; c < d0; ++c) {
      const bool rt = r < V, ct = c < V;
      if (selection == Selection::kPaper) {
        if (rt && ct) {
          if (r == c && !s.heldout[r]) b.Add(r, c, "I_t");
          if (s.partner[r] == c) b.Add(r, c, "C");
        } else if (!rt && !ct) {
          const int64_t u = r - V, v = c - V;
          for (int64_t shift : s.paper_shifts) {
            const bool match = s.cyclic_positions ? ((u - v - shift) % P + P) % P == 0 : u - v == shift;
            if (match) {
              b.Add(r, c, "S_" + Num(shift));
              break;
            }
          }
        }
        continue;
      }
      if (rt && ct) {
        b.Add(r, c, TokenPairOrbit(s, r, c));
      } else if (!rt && !ct) {
        const int64_t u = r - V, v = c - V;
        b.Add(r, c, s.cyclic_positions ? "S_" + Num(((u - v) % P + P) % P) : "P[" + Num(u) + "," + Num(v) + "]");
      } else if (rt) {
        // Query token class x key position: with cyclic positions the key side
        // is constant over keys (every block's position part sums to 1): a gauge.
        const std::string cls = s.class_names[s.token_class[r]];
        if (s.cyclic_positions) {
          b.Add(r, c, "T[" + cls + ",pos]", /*gauge=*/true);
        } else {
          b.Add(r, c, "T[" + cls + "," + Num(c - V) + "]");
        }
      } else {
        const std::string cls = s.class_names[s.token_class[c]];
        b.Add(r, c, s.cyclic_positions ? "T[pos," + cls + "]" : "T[" + Num(r - V) + "," + cls + "]");
      }
    }
  }
  return b.Take();
}

BlockParts ReadoutParts(const TaskSymmetry& s, Selection selection) {
  const int64_t V = s.vocab(), d0 = s.d0();
  PartBuilder b(V, d0);
  for (int64_t r = 0; r < V; ++r) {
    for (int64_t c = 0; c < d0; ++c) {
      if (selection == Selection::kPaper) {
        if (c < V && r == c && !s.heldout[r]) b.Add(r, c, "I");
        if (c < V && s.partner[c] == r) b.Add(r, c, "C");
        continue;
      }
      if (c < V) {
        b.Add(r, c, TokenPairOrbit(s, r, c));
      } else {
        // A class-wise logit shift by position (gauge only if the class were
        // every token).
        const std::string cls = s.class_names[s.token_class[r]];
        b.Add(r, c, s.cyclic_positions ? "T[" + cls + ",pos]" : "T[" + cls + "," + Num(c - V) + "]");
      }
    }
  }
  return b.Take();
}

int32_t FindCoordinate(const Basis& basis, const std::string& name) {
  for (const CoordinateDef& c : basis.coords) {
    if (c.label == name || (!c.canonical.empty() && c.canonical == name)) return c.index;
  }
  return -1;
}

std::string PathName(int64_t index, int64_t depth, int64_t layers, int64_t heads) {
  std::vector<int64_t> digits;
  bool any = false;
  for (int64_t m = 0; m < layers; ++m) {
    int64_t h = 0;
    if (m < depth) {
      h = index % (heads + 1);
      index /= (heads + 1);
    }
    any |= h != 0;
    digits.push_back(h);
  }
  if (!any) return "∅";
  return absl::StrCat("(", absl::StrJoin(digits, ","), ")");
}

int64_t BasisSize(const TaskSymmetry& sym, int64_t layers, int64_t heads, Selection selection) {
  const int64_t kq = static_cast<int64_t>(KeyQueryParts(sym, selection).names.size());
  const int64_t readout = static_cast<int64_t>(ReadoutParts(sym, selection).names.size());
  int64_t size = 0, blocks = 1;
  for (int64_t l = 1; l <= layers; ++l) {
    size += heads * blocks * blocks * kq;
    blocks *= heads + 1;
  }
  return size + blocks * readout;
}

Basis BuildBasis(const TaskSymmetry& sym, int64_t layers, int64_t heads, Selection selection) {
  Basis basis;
  basis.selection = selection;
  basis.layers = layers;
  basis.heads = heads;
  basis.kq = KeyQueryParts(sym, selection);
  basis.readout = ReadoutParts(sym, selection);
  const bool canonical = selection == Selection::kPaper && layers == 2;
  const std::string first = PathName(1, 1, layers, heads);  // "(1,0)": what head 1 of layer 1 copied
  auto add = [&](CoordinateDef def) {
    def.index = static_cast<int32_t>(basis.coords.size());
    basis.coords.push_back(std::move(def));
  };
  int64_t blocks = 1;
  for (int64_t l = 1; l <= layers; ++l) {
    for (int64_t h = 1; h <= heads; ++h) {
      const std::string matrix = "L" + std::to_string(l) + "H" + std::to_string(h);
      for (int64_t q = 0; q < blocks; ++q) {
        for (int64_t k = 0; k < blocks; ++k) {
          for (size_t p = 0; p < basis.kq.names.size(); ++p) {
            CoordinateDef d;
            d.matrix = matrix;
            d.layer = static_cast<int>(l);
            d.head = static_cast<int>(h);
            d.block_q = PathName(q, l - 1, layers, heads);
            d.block_k = PathName(k, l - 1, layers, heads);
            d.element = basis.kq.names[p];
            d.label = matrix + ":[" + d.block_q + "→" + d.block_k + "]:" + d.element;
            d.norm = std::sqrt(static_cast<double>(basis.kq.sizes[p]));
            d.gauge = basis.kq.gauge[p];
            if (canonical && h == 1) {
              // SCIENCE.md C.5.
              if (l == 1 && d.element == "S_1") d.canonical = "alpha";
              if (l == 2 && d.block_q == "∅" && d.block_k == first && d.element == "I_t") d.canonical = "beta";
            }
            add(std::move(d));
          }
        }
      }
    }
    blocks *= heads + 1;
  }
  const std::string gamma_block = PathName(heads + 1, 2, layers, heads);  // "(0,1)": layer-2 head copied raw
  for (int64_t b = 0; b < blocks; ++b) {
    for (size_t p = 0; p < basis.readout.names.size(); ++p) {
      CoordinateDef d;
      d.matrix = "OUT";
      d.block_k = PathName(b, layers, layers, heads);
      d.element = basis.readout.names[p];
      d.label = "OUT:[" + d.block_k + "]:" + d.element;
      d.norm = std::sqrt(static_cast<double>(basis.readout.sizes[p]));
      d.gauge = basis.readout.gauge[p];
      if (canonical && d.block_k == gamma_block && d.element == "I") d.canonical = "gamma";
      if (canonical && d.block_k == "∅" && d.element == "C") d.canonical = "delta";
      add(std::move(d));
    }
  }
  return basis;
}

}  // namespace circuitlab::engine
