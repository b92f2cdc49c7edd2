#include "server/engine/basis/basis.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"

namespace circuitlab::engine {
namespace {

// A task symmetry like associative recall's: FILL, SEP, QRY, GIVE singletons,
// `common` tokens in fixed pairs, `rare` and held-out rare tokens.
TaskSymmetry Symmetry(int common, int rare, int heldout, int64_t positions, bool cyclic = true, int64_t k = 2) {
  TaskSymmetry s;
  s.class_names = {"FILL", "SEP", "QRY", "GIVE", "common", "rare", "heldout"};
  for (int t = 0; t < 4; ++t) s.token_class.push_back(t);
  for (int i = 0; i < common; ++i) s.token_class.push_back(4);
  for (int i = 0; i < rare; ++i) s.token_class.push_back(5);
  for (int i = 0; i < heldout; ++i) s.token_class.push_back(6);
  s.partner.assign(s.token_class.size(), -1);
  for (int i = 0; i + 1 < common; i += 2) {
    s.partner[4 + i] = 4 + i + 1;
    s.partner[4 + i + 1] = 4 + i;
  }
  s.heldout.assign(s.token_class.size(), false);
  for (int i = 0; i < heldout; ++i) s.heldout[4 + common + rare + i] = true;
  s.positions = positions;
  s.cyclic_positions = cyclic;
  s.paper_shifts.clear();
  for (int64_t r = 0; r < k; ++r) s.paper_shifts.push_back(r);
  return s;
}

std::map<std::string, int> CountByMatrix(const Basis& b) {
  std::map<std::string, int> n;
  for (const auto& c : b.coords) n[c.layer == 0 ? "out" : absl::StrCat("L", c.layer)]++;
  return n;
}

// SCIENCE.md E.1: the 2-layer, 1-head invariant subspace of a task without a
// fixed relation and block length 2 has 3 + 12 + 4 = 19 dimensions; with C,
// 4 + 16 + 8 = 28. Layer 1 is I_t, S_0, S_1 ("diag(a1 I, a2 I + a3 M)").
TEST(BasisTest, TwoLayerPaperSpanHas19Dimensions28WithTheRelation) {
  Basis b = BuildBasis(Symmetry(0, 16, 4, 16), 2, 1, Selection::kPaper);
  auto n = CountByMatrix(b);
  EXPECT_EQ(n["L1"], 3);
  EXPECT_EQ(n["L2"], 12);
  EXPECT_EQ(n["out"], 4);
  EXPECT_EQ(b.coords.size(), 19u);
  std::vector<std::string> layer1;
  for (const auto& c : b.coords) {
    if (c.layer == 1) layer1.push_back(c.element);
    EXPECT_GT(c.norm, 0.0) << c.label << ": an empty element would make the Gram matrix singular";
  }
  EXPECT_EQ(layer1, (std::vector<std::string>{"I_t", "S_0", "S_1"}));
  // Elements of one block are disjoint 0/1 matrices: the Gram matrix is
  // diagonal with full rank (each entry belongs to at most one part).
  std::set<int32_t> used(b.kq.part.begin(), b.kq.part.end());
  used.erase(-1);
  EXPECT_EQ(used.size(), b.kq.names.size());

  Basis c = BuildBasis(Symmetry(8, 16, 4, 16), 2, 1, Selection::kPaper);
  n = CountByMatrix(c);
  EXPECT_EQ(n["L1"], 4);
  EXPECT_EQ(n["L2"], 16);
  EXPECT_EQ(n["out"], 8);
  EXPECT_EQ(c.coords.size(), 28u);
}

TEST(BasisTest, CanonicalCoordinatesSitWhereC5PutsThem) {
  Basis b = BuildBasis(Symmetry(8, 16, 4, 16), 2, 1, Selection::kPaper);
  std::map<std::string, std::string> label;
  for (const auto& c : b.coords) {
    if (!c.canonical.empty()) label[c.canonical] = c.label;
  }
  EXPECT_EQ(label["alpha"], "L1H1:[∅→∅]:S_1");
  EXPECT_EQ(label["beta"], "L2H1:[∅→(1,0)]:I_t");
  EXPECT_EQ(label["gamma"], "OUT:[(0,1)]:I");
  EXPECT_EQ(label["delta"], "OUT:[∅]:C");
}

TEST(BasisTest, CompleteSetPartitionsEveryBlockIntoOrbits) {
  TaskSymmetry s = Symmetry(8, 16, 4, 16);
  BlockParts kq = KeyQueryParts(s, Selection::kComplete);
  for (int32_t p : kq.part) EXPECT_GE(p, 0);
  EXPECT_EQ(std::accumulate(kq.sizes.begin(), kq.sizes.end(), int64_t{0}), s.d0() * s.d0());
  std::set<std::string> names(kq.names.begin(), kq.names.end());
  for (const char* want : {"I[common]", "C[common]", "O[common]", "I[rare]", "O[rare]", "I[heldout]", "J[rare,common]",
                           "J[FILL,rare]", "S_0", "S_1", "S_15", "T[pos,rare]", "T[rare,pos]"}) {
    EXPECT_TRUE(names.count(want)) << want;
  }
  EXPECT_FALSE(names.count("C[rare]")) << "rare tokens have no fixed partner";
  // 7 classes: 49 class pairs, split for the 3 multi-token classes into
  // I/O (+C for common); P circulants; query-class x positions both ways.
  EXPECT_EQ(kq.names.size(), 49u + 3u + 1u + 16u + 7u + 7u);
  for (size_t p = 0; p < kq.names.size(); ++p) {
    EXPECT_EQ(kq.gauge[p], kq.names[p].rfind("T[", 0) == 0 && kq.names[p].find(",pos]") != std::string::npos)
        << kq.names[p];
  }
  BlockParts out = ReadoutParts(s, Selection::kComplete);
  for (int32_t p : out.part) EXPECT_GE(p, 0);
  EXPECT_EQ(out.names.size(), 49u + 3u + 1u + 7u);
}

TEST(BasisTest, AbsolutePositionsHaveNoShiftSymmetry) {
  TaskSymmetry s = Symmetry(0, 8, 0, 5, /*cyclic=*/false, 2);
  BlockParts kq = KeyQueryParts(s, Selection::kComplete);
  int position_parts = 0;
  for (const auto& n : kq.names) position_parts += n.rfind("P[", 0) == 0;
  EXPECT_EQ(position_parts, 25);  // every (u, v) pair is its own orbit
  BlockParts paper = KeyQueryParts(s, Selection::kPaper);
  // S_1 = "attend one back": (u, u-1) for u >= 1, not wrapping around.
  auto it = std::find(paper.names.begin(), paper.names.end(), "S_1");
  ASSERT_NE(it, paper.names.end());
  EXPECT_EQ(paper.sizes[it - paper.names.begin()], 4);
}

TEST(BasisTest, PathsAndLabelsFollowTheBlockConvention) {
  EXPECT_EQ(PathName(0, 0, 2, 1), "∅");
  EXPECT_EQ(PathName(1, 1, 2, 1), "(1,0)");
  EXPECT_EQ(PathName(2, 2, 2, 1), "(0,1)");
  EXPECT_EQ(PathName(3, 2, 2, 1), "(1,1)");
  EXPECT_EQ(PathName(2, 2, 3, 1), "(0,1,0)");
  EXPECT_EQ(PathName(5, 2, 2, 2), "(2,1)");
  Basis b = BuildBasis(Symmetry(0, 16, 0, 8), 3, 1, Selection::kPaper);
  EXPECT_EQ(b.coords.size(), static_cast<size_t>(1 * 3 + 4 * 3 + 16 * 3 + 8 * 1));
  EXPECT_EQ(b.coords.back().label, "OUT:[(1,1,1)]:I");
}

}  // namespace
}  // namespace circuitlab::engine
