// Run labels (SCIENCE.md D.2, D.3) of an IMIR run: at every checkpoint ICL
// vs IWL by behaviour and by coordinates, the head-ablation profile (per
// layer and per head) and the head pair that carries the induction path; the run's label, its final
// pair and the pair its initial weights predict.
#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/common/seeds.h"
#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/setup/imir_setup.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

// A candidate pair of D.3: previous-token head h at layer i, induction head
// g at layer j > i, named "i-j" on one-head models and "LiHh-LjHg" on
// others, with the labels of its three coordinates prev, match, out.
struct LayerPair {
  std::string name, prev, match, out;
};

std::vector<LayerPair> LayerPairs(int64_t L, int64_t H) {
  std::vector<LayerPair> pairs;
  auto head = [](int64_t l, int64_t h) { return absl::StrCat("L", l, "H", h); };
  for (int64_t i = 1; i <= L; ++i) {
    for (int64_t j = i + 1; j <= L; ++j) {
      for (int64_t h = 1; h <= H; ++h) {
        for (int64_t g = 1; g <= H; ++g) {
          pairs.push_back({H == 1 ? absl::StrCat(i, "-", j) : absl::StrCat(head(i, h), "-", head(j, g)),
                           KqLabel(i, h, "∅", "∅", "S_1"), KqLabel(j, g, "∅", HeadBlock(i, h, L, H), "I_t"),
                           OutLabel(HeadBlock(j, g, L, H), "I")});
        }
      }
    }
  }
  return pairs;
}

// The share of the accuracy above chance that `after` has lost.
double Removed(double acc, double after, double chance) {
  return acc - chance > 1e-9 ? std::clamp((acc - after) / (acc - chance), 0.0, 1.0) : 0.0;
}

// D.3's winning pair, refined for redundant circuits [P]. Candidate pair
// (i, j) owns one coordinate, its match; prev_i and out_j are shared with
// other pairs. Zeroing the match coordinates of a set
// of pairs (W - sum c_k B_k, the rest of the weights kept) removes exactly
// those paths. The label is the smallest set whose removal takes away at
// least half of the accuracy above chance: "2-3", or "1-3+2-3" when two
// pairs cover for each other (removing either alone leaves the other); among
// sets of that size the one removing most, MIXED when another removes at
// least 90% as much, OTHER when no set of up to three pairs does (the
// behaviour lives outside the candidate paths). Every set tried is reported
// in `ablation` with the share it removes.
// `scores` are the pairs' |prev| |match| |out|, in the order of `pairs`.
std::string PathLabel(const Opened& o, const Projector& projector, const Basis& paper, const std::vector<double>& c,
                      const std::vector<LayerPair>& pairs, const std::vector<std::pair<std::string, double>>& scores,
                      const EvalData& d, double acc, double chance,
                      std::vector<std::pair<std::string, double>>& ablation) {
  struct Candidate {
    std::string name;
    double score;
    int32_t match;
  };
  std::vector<Candidate> candidates;
  double top = 0;
  for (const auto& [name, s] : scores) top = std::max(top, s);
  for (size_t k = 0; k < pairs.size(); ++k) {
    const int32_t match = FindCoordinate(paper, pairs[k].match);
    if (match >= 0 && scores[k].second > 1e-3 * top) candidates.push_back({pairs[k].name, scores[k].second, match});
  }
  // At most six candidates (the largest scores): 41 subsets of up to three.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  if (candidates.size() > 6) candidates.resize(6);
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.name < b.name; });
  const int n = static_cast<int>(candidates.size());
  for (int size = 1; size <= std::min(3, n); ++size) {
    std::vector<std::pair<double, std::string>> qualified;
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      if (std::popcount(mask) != size) continue;
      std::vector<double> cut = c;
      std::string name;
      for (int k = 0; k < n; ++k) {
        if (!(mask & (1u << k))) continue;
        cut[static_cast<size_t>(candidates[static_cast<size_t>(k)].match)] = 0.0;
        name += (name.empty() ? "" : "+") + candidates[static_cast<size_t>(k)].name;
      }
      const std::unique_ptr<ImirModel> model = MovedCoords(o, projector, c, cut);
      const double after = Accuracy(Logits(*model, d), d.target);
      const double removed = Removed(acc, after, chance);
      ablation.emplace_back(name, removed);
      if (removed >= 0.5) qualified.emplace_back(removed, name);
    }
    if (qualified.empty()) continue;
    std::sort(qualified.rbegin(), qualified.rend());
    return qualified.size() >= 2 && qualified[1].first >= 0.9 * qualified[0].first ? "MIXED" : qualified[0].second;
  }
  return "OTHER";
}

// What every checkpoint of a run is measured with.
struct LabelContext {
  LabelContext(const v1::ExperimentSpec& s, std::unique_ptr<BlockTask> t) : spec(s), task(std::move(t)) {}
  const v1::ExperimentSpec& spec;
  std::unique_ptr<BlockTask> task;
  int64_t L = 0, H = 0;
  std::string icl_set, primary;
  std::map<std::string, EvalData> data;
  Basis paper;
  std::unique_ptr<Projector> projector;
  std::vector<LayerPair> pairs;
  double chance = 0;

  // Pair scores |prev| |match| |out| for every candidate pair.
  std::vector<std::pair<std::string, double>> PairScores(const std::vector<double>& c) const {
    std::vector<std::pair<std::string, double>> out;
    for (const LayerPair& p : pairs) {
      out.emplace_back(p.name, Magnitude(paper, c, p.prev) * Magnitude(paper, c, p.match) * Magnitude(paper, c, p.out));
    }
    return out;
  }
  double ValueOf(const std::vector<double>& c, const char* canonical) const {
    const int32_t id = FindCoordinate(paper, canonical);
    return id < 0 ? 0.0 : c[static_cast<size_t>(id)];
  }
};

absl::StatusOr<LabelContext> MakeContext(const v1::ExperimentSpec& spec, uint32_t n_eval) {
  LabelContext x(spec, MakeBlockTask(spec, PoolSeedOf(spec.seed())));
  const auto& m = spec.model().imir();
  x.L = m.num_layers();
  x.H = m.num_heads();
  std::set<std::string> sets;
  for (const EvalSetInfo& info : x.task->EvalSets()) sets.insert(info.name);
  x.primary = PrimaryEvalSet(spec);
  // SCIENCE.md G.5: coordinate models are labelled ICL by icl_holdout, dense
  // one-hot models by icl_rare (their held-out rows never train). The paper
  // basis's I_t leaves held-out tokens out as well (G.5), so only coordinate
  // models over the complete basis can answer icl_holdout.
  const bool holdout =
      m.parameterisation() == v1::PARAMETERISATION_COORDINATES && m.coordinate_basis() == v1::BASIS_SELECTION_COMPLETE;
  x.icl_set = holdout && sets.count("icl_holdout") ? "icl_holdout" : x.primary;
  for (const std::string& name : {x.icl_set, x.primary, std::string("iwl"), std::string("conflict")}) {
    if (!sets.count(name) || x.data.count(name)) continue;
    absl::StatusOr<EvalData> d = MakeEval(*x.task, name, n_eval, spec.seed());
    if (!d.ok()) return d.status();
    x.data.emplace(name, std::move(*d));
  }
  x.paper = BuildBasis(x.task->Symmetry(), x.L, x.H, Selection::kPaper);
  x.projector = std::make_unique<Projector>(x.paper);
  x.pairs = LayerPairs(x.L, x.H);
  x.chance = 1.0 / static_cast<double>(x.task->vocab_size());
  return x;
}

// One checkpoint's behaviour, head ablations and pair; its alpha, beta,
// gamma, delta into `abgd`.
absl::StatusOr<v1::CheckpointLabel> LabelCheckpoint(const LabelContext& x, int64_t step, const std::string& bytes,
                                                    std::array<double, 4>& abgd) {
  absl::StatusOr<Opened> o = Open(x.spec, bytes, Selection::kPaper);
  if (!o.ok()) return o.status();
  // Open projected onto the paper basis already unless the run's own
  // coordinate basis is the complete one.
  const std::vector<double> c =
      o->basis.selection == Selection::kPaper ? o->values : Project(*x.projector, *o->dense, 0).values;
  v1::CheckpointLabel r;
  r.set_step(static_cast<uint64_t>(step));
  r.set_icl_set(x.icl_set);
  const EvalData& icl = x.data.at(x.icl_set);
  r.set_icl_accuracy(Accuracy(Logits(*o->dense, icl), icl.target));
  r.set_icl(r.icl_accuracy() >= 0.5);
  if (x.data.count("iwl")) {
    const EvalData& d = x.data.at("iwl");
    r.set_iwl_accuracy(Accuracy(Logits(*o->dense, d), d.target));
    r.set_iwl(r.iwl_accuracy() >= 0.5);
  }
  if (x.data.count("conflict")) {
    const EvalData& d = x.data.at("conflict");
    const torch::Tensor logits = Logits(*o->dense, d);
    r.set_conflict_logit_diff(
        (logits.gather(1, d.target.unsqueeze(1)) - logits.gather(1, d.alt_target.unsqueeze(1))).mean().item<double>());
  }
  abgd = {x.ValueOf(c, "alpha"), x.ValueOf(c, "beta"), x.ValueOf(c, "gamma"), x.ValueOf(c, "delta")};
  if (x.L < 2) return r;
  const EvalData& d = x.data.at(x.primary);
  const double acc = Accuracy(Logits(*o->dense, d), d.target);
  auto ablated_accuracy = [&](int64_t l, int64_t first, int64_t last) {  // heads first..last of layer l
    std::unique_ptr<ImirModel> ablated = DenseLike(*x.task, x.L, x.H);
    CopyDense(*o->dense, *ablated);
    for (int64_t h = first; h <= last; ++h) AblateHead(*ablated, l, h);
    return Accuracy(Logits(*ablated, d), d.target);
  };
  for (int64_t l = 1; l <= x.L; ++l) {
    r.add_head_ablation(Removed(acc, ablated_accuracy(l, 1, x.H), x.chance));
    for (int64_t h = 1; h <= x.H; ++h) {
      const double alone =
          x.H == 1 ? r.head_ablation(static_cast<int>(l) - 1) : Removed(acc, ablated_accuracy(l, h, h), x.chance);
      (*r.mutable_per_head_ablation())[absl::StrCat("L", l, "H", h)] = alone;
    }
  }
  const std::vector<std::pair<std::string, double>> scores = x.PairScores(c);
  for (const auto& [name, s] : scores) (*r.mutable_pair_scores())[name] = s;
  if (acc < 0.5) {
    r.set_pair("NONE");
  } else {
    std::vector<std::pair<std::string, double>> ablation;
    r.set_pair(PathLabel(*o, *x.projector, x.paper, c, x.pairs, scores, d, acc, x.chance, ablation));
    for (const auto& [name, s] : ablation) (*r.mutable_pair_ablation())[name] = s;
  }
  return r;
}

// Coordinates against their run maximum (D.2), the per-checkpoint labels
// and the run's label.
void LabelByCoordinates(const std::vector<std::array<double, 4>>& abgd, v1::LabelRunResponse& report) {
  std::array<double, 4> peak = {0, 0, 0, 0};
  for (const auto& v : abgd) {
    for (size_t i = 0; i < 4; ++i) peak[i] = std::max(peak[i], v[i]);
  }
  auto grown = [&](const std::array<double, 4>& v, size_t i) { return peak[i] > 0 && v[i] >= 0.1 * peak[i]; };
  bool was_icl = false;
  for (int k = 0; k < report.checkpoints_size(); ++k) {
    v1::CheckpointLabel& r = *report.mutable_checkpoints(k);
    const auto& v = abgd[static_cast<size_t>(k)];
    r.set_coords_icl(grown(v, 0) && grown(v, 1) && grown(v, 2));
    r.set_coords_iwl(grown(v, 3));
    r.set_consistent(r.icl() == r.coords_icl() && r.iwl() == r.coords_iwl());
    r.set_label(r.icl() && r.iwl() ? (r.conflict_logit_diff() > 0 ? "BOTH_ICL_WINS" : "BOTH_IWL_WINS")
                : r.icl()          ? "ICL_ONLY"
                : r.iwl()          ? "IWL_ONLY"
                                   : "NEITHER");
    if (k + 1 < report.checkpoints_size()) was_icl = was_icl || r.icl();
  }
  const v1::CheckpointLabel& last = report.checkpoints(report.checkpoints_size() - 1);
  report.set_label(was_icl && !last.icl() ? "TRANSIENT_ICL" : last.label());
  report.set_pair(last.pair());
}

// The magnitude-only predictor: the pair with the largest score in the
// initial weights.
std::string PredictedPair(const LabelContext& x) {
  std::unique_ptr<ImirModel> init = MakeModel(x.spec, *x.task, 1, torch::kCPU);
  InitializeModel({x.spec}, *init);
  std::unique_ptr<ImirModel> dense = DenseLike(*x.task, x.L, x.H);
  CopyDense(*init, *dense);
  const auto scores = x.PairScores(Project(*x.projector, *dense, 0).values);
  const auto best =
      std::max_element(scores.begin(), scores.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return best->second > 0 ? best->first : "NONE";
}

}  // namespace

absl::StatusOr<v1::LabelRunResponse> ImirLabelRun(const v1::ExperimentSpec& spec,
                                                  const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                                  const v1::LabelRunRequest& request, const AnalysisProgress& progress,
                                                  const CancelToken* cancel) {
  at::set_num_threads(1);
  if (checkpoints.empty()) return absl::FailedPreconditionError("the run has no checkpoint yet");
  if (request.n_eval() == 0) return absl::InvalidArgumentError("LabelRun needs its canonical request (n_eval)");
  absl::StatusOr<LabelContext> x = MakeContext(spec, request.n_eval());
  if (!x.ok()) return x.status();
  v1::LabelRunResponse report;
  std::vector<std::array<double, 4>> abgd(checkpoints.size());  // alpha, beta, gamma, delta per checkpoint
  for (size_t k = 0; k < checkpoints.size(); ++k) {
    absl::StatusOr<v1::CheckpointLabel> r = LabelCheckpoint(*x, checkpoints[k].first, checkpoints[k].second, abgd[k]);
    if (!r.ok()) return r.status();
    *report.add_checkpoints() = std::move(*r);
    if (progress) progress(static_cast<double>(k + 1) / static_cast<double>(checkpoints.size() + 1));
    if (cancel != nullptr && cancel->stop_requested()) return absl::CancelledError("labelling stopped");
  }
  LabelByCoordinates(abgd, report);
  if (x->L >= 2) report.set_pair_predicted(PredictedPair(*x));
  if (progress) progress(1.0);
  return report;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::LabelRunRequest, v1::LabelRunResponse,
                           [](const AnalysisInput& in, const v1::LabelRunRequest& r, const AnalysisProgress& progress, const CancelToken* cancel) { return ImirLabelRun(in.spec, in.checkpoints, r, progress, cancel); });

}  // namespace circuitlab::engine
