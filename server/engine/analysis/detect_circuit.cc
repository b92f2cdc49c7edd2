// Automatic circuit detection (SCIENCE.md D.1) on one IMIR checkpoint: the
// smallest coordinate set K* keeping the metric within tolerance of the
// reference, the roles of its members, the template it matches.
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

bool IsTwoHop(const v1::ExperimentSpec& spec) { return spec.task().has_k_hop() && spec.task().k_hop().hops() == 2; }

// Candidate templates for the task and model: each a name, its layers and its
// element labels (roles: canonical; the 2-hop shortcut is listed apart).
struct Template {
  std::string name;
  std::vector<int> layers;
  std::vector<std::string> elements;
  std::string shortcut;  // 2-hop: OUT reading the middle head
};

std::vector<Template> Templates(const v1::ExperimentSpec& spec, int64_t L, int64_t H) {
  std::vector<Template> out;
  for (int64_t i = 1; i <= L; ++i) {
    for (int64_t hi = 1; hi <= H; ++hi) {
      const std::string bi = HeadBlock(i, hi, L, H);
      for (int64_t j = i + 1; j <= L; ++j) {
        for (int64_t hj = 1; hj <= H; ++hj) {
          const std::string bj = HeadBlock(j, hj, L, H);
          const std::string prev = KqLabel(i, hi, "∅", "∅", "S_1");
          const std::string match = KqLabel(j, hj, "∅", bi, "I_t");
          if (!IsTwoHop(spec)) {
            out.push_back(
                {"induction_head", {static_cast<int>(i), static_cast<int>(j)}, {prev, match, OutLabel(bj, "I")}, ""});
            continue;
          }
          for (int64_t k = j + 1; k <= L; ++k) {
            for (int64_t hk = 1; hk <= H; ++hk) {
              const std::string bk = HeadBlock(k, hk, L, H);
              out.push_back({"two_hop_chain",
                             {static_cast<int>(i), static_cast<int>(j), static_cast<int>(k)},
                             {prev, match, KqLabel(k, hk, bj, bi, "I_t"), OutLabel(bk, "I")},
                             OutLabel(bj, "I")});
            }
          }
        }
      }
    }
  }
  return out;
}

// The metric a request names ("accuracy", "loss" or "p_target") of logits
// against the targets.
double MetricOf(const std::string& metric, const torch::Tensor& logits, const torch::Tensor& target) {
  if (metric == "loss") return Loss(logits, target);
  if (metric == "p_target") return torch::softmax(logits, -1).gather(1, target.unsqueeze(1)).mean().item<double>();
  return Accuracy(logits, target);
}

// One detection: the opened checkpoint, its evaluation set, the metric and
// the evaluation count.
class Detection {
 public:
  Detection(Opened& o, EvalData data, const v1::DetectCircuitRequest& req, const AnalysisProgress& progress,
            const CancelToken* cancel)
      : o_(o),
        data_(std::move(data)),
        req_(req),
        progress_(progress),
        cancel_(cancel),
        scratch_(DenseLike(*o.task, o.layers, o.heads)),
        lower_better_(req.metric() == "loss") {}

  absl::StatusOr<v1::DetectCircuitResponse> Run(const v1::ExperimentSpec& spec) {
    v1::DetectCircuitResponse report;
    report.set_eval_set(data_.name);
    // Gauge directions never change the function: drop them first.
    std::vector<double> c = o_.values;
    for (const CoordinateDef& d : o_.basis.coords) {
      if (d.gauge) c[static_cast<size_t>(d.index)] = 0;
    }
    report.set_m_dense(MetricOf(req_.metric(), Logits(*o_.dense, data_), data_.target));
    m_ref_ = Metric(c);
    report.set_m_ref(m_ref_);
    report.set_projection_not_faithful(std::abs(report.m_dense() - report.m_ref()) > 0.05);
    int64_t candidates = 0;
    for (double v : c) candidates += v != 0 ? 1 : 0;
    report.set_candidates(static_cast<uint32_t>(candidates));
    estimate_ = static_cast<double>(std::min<int64_t>(req_.max_evals(), candidates * 2 + 4));
    if (absl::Status s = Prune(c, report); !s.ok()) return s;
    report.set_m_circuit(Metric(c));
    std::vector<size_t> kept;
    for (size_t a = 0; a < c.size(); ++a) {
      if (c[a] != 0) kept.push_back(a);
    }
    std::sort(kept.begin(), kept.end(), [&](size_t x, size_t y) { return Mag(c, x) > Mag(c, y); });
    std::set<std::string> canonical, shortcut;
    Recognise(spec, kept, report, canonical, shortcut);
    if (absl::Status s = Members(c, kept, canonical, shortcut, report); !s.ok()) return s;
    report.set_evaluations(static_cast<uint32_t>(evals_));
    if (progress_) progress_(1.0);
    return report;
  }

 private:
  double Metric(const std::vector<double>& c) {
    ++evals_;
    LoadCoords(o_, c, *scratch_);
    return MetricOf(req_.metric(), Logits(*scratch_, data_), data_.target);
  }
  bool Good(double m) const { return lower_better_ ? m <= m_ref_ + req_.tolerance() : m >= m_ref_ - req_.tolerance(); }
  double Mag(const std::vector<double>& c, size_t a) const { return std::abs(c[a]) * o_.basis.coords[a].norm; }
  bool Stopped() const { return cancel_ != nullptr && cancel_->stop_requested(); }

  // The prepass (bulk-drop the tiny coordinates), then greedy passes that
  // zero one coordinate at a time while the metric stays good.
  absl::Status Prune(std::vector<double>& c, v1::DetectCircuitResponse& report) {
    double max_mag = 0;
    for (size_t a = 0; a < c.size(); ++a) max_mag = std::max(max_mag, Mag(c, a));
    if (req_.prepass_eps() > 0 && max_mag > 0) {
      std::vector<double> trial = c;
      bool any = false;
      for (size_t a = 0; a < c.size(); ++a) {
        if (c[a] != 0 && Mag(c, a) < req_.prepass_eps() * max_mag) {
          trial[a] = 0;
          any = true;
        }
      }
      if (any && Good(Metric(trial))) c = trial;
    }
    for (uint32_t pass = 0; pass < req_.max_passes() && !report.budget_exhausted(); ++pass) {
      std::vector<size_t> order;
      for (size_t a = 0; a < c.size(); ++a) {
        if (c[a] != 0) order.push_back(a);
      }
      if (absl::Status s = Order(c, order); !s.ok()) return s;
      bool changed = false;
      for (size_t a : order) {
        if (evals_ >= req_.max_evals()) {
          report.set_budget_exhausted(true);
          break;
        }
        std::vector<double> trial = c;
        trial[a] = 0;
        if (Good(Metric(trial))) {
          c = trial;
          changed = true;
        }
        if (progress_) progress_(std::min(0.99, static_cast<double>(evals_) / estimate_));
        if (Stopped()) return absl::CancelledError("circuit detection stopped");
      }
      if (!changed) break;
    }
    return absl::OkStatus();
  }

  // The order a greedy pass tries the coordinates in.
  absl::Status Order(const std::vector<double>& c, std::vector<size_t>& order) {
    if (req_.order() == "label") {
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t x, size_t y) { return o_.basis.coords[x].label < o_.basis.coords[y].label; });
    } else if (req_.order() == "effect_asc") {
      std::map<size_t, double> damage;
      for (size_t a : order) {
        if (evals_ >= req_.max_evals()) break;
        std::vector<double> trial = c;
        trial[a] = 0;
        const double m = Metric(trial);
        damage[a] = lower_better_ ? m - m_ref_ : m_ref_ - m;
        if (Stopped()) return absl::CancelledError("circuit detection stopped");
      }
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return damage[x] < damage[y]; });
    } else {  // magnitude_asc
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return Mag(c, x) < Mag(c, y); });
    }
    return absl::OkStatus();
  }

  // The template K* matches: the candidate with the most elements in K*
  // (all of them for a match), smallest layers first; in-weights memory when
  // K* keeps OUT:[∅]:C.
  void Recognise(const v1::ExperimentSpec& spec, const std::vector<size_t>& kept, v1::DetectCircuitResponse& report,
                 std::set<std::string>& canonical, std::set<std::string>& shortcut) const {
    std::set<std::string> in_circuit;
    for (size_t a : kept) in_circuit.insert(o_.basis.coords[a].label);
    const std::vector<Template> templates = Templates(spec, o_.layers, o_.heads);
    const Template* best = nullptr;
    int best_found = -1;
    for (const Template& t : templates) {
      int found = 0;
      for (const std::string& e : t.elements) found += in_circuit.count(e) ? 1 : 0;
      if (found > best_found) {
        best = &t;
        best_found = found;
      }
    }
    std::string name;
    if (best != nullptr) {
      const bool complete = best_found == static_cast<int>(best->elements.size());
      for (const std::string& e : best->elements) {
        const int32_t id = FindCoordinate(o_.basis, e);
        v1::TemplateElement* t = report.add_template_elements();
        t->set_label(e);
        t->set_canonical(id >= 0 ? o_.basis.coords[static_cast<size_t>(id)].canonical : "");
        t->set_found(in_circuit.count(e) > 0);
        if (complete) canonical.insert(e);
      }
      if (complete) {
        name = best->name;
        for (int l : best->layers) report.add_template_layers(static_cast<uint32_t>(l));
        if (!best->shortcut.empty()) shortcut.insert(best->shortcut);
      }
    }
    const std::string iwl = OutLabel("∅", "C");
    if (in_circuit.count(iwl)) {
      canonical.insert(iwl);
      name += name.empty() ? "in_weights_memory" : "+in_weights_memory";
    }
    report.set_template_name(name);
  }

  // Necessity and role of each member of K*, and the attention diagnostics:
  // R_l = the key each sequence's query attends to most under K*;
  // irrelevant mass = 1 - attention on it.
  absl::Status Members(const std::vector<double>& c, const std::vector<size_t>& kept,
                       const std::set<std::string>& canonical, const std::set<std::string>& shortcut,
                       v1::DetectCircuitResponse& report) {
    std::vector<torch::Tensor> attn_k;
    LoadCoords(o_, c, *scratch_);
    Logits(*scratch_, data_, &attn_k);
    std::vector<torch::Tensor> focus;
    for (const torch::Tensor& a : attn_k) {
      focus.push_back(a.argmax(-1, true));  // [H, B, 1]
      report.add_irrelevant_mass(1.0 - a.gather(-1, focus.back()).mean().item<double>());
    }
    for (size_t a : kept) {
      const CoordinateDef& def = o_.basis.coords[a];
      v1::CircuitCoordinate* member = report.add_circuit();
      FillCoordinate(def, c[a], member->mutable_coordinate());
      std::vector<double> trial = c;
      trial[a] = 0;
      std::vector<torch::Tensor> attn;
      LoadCoords(o_, trial, *scratch_);
      ++evals_;
      const double m = MetricOf(req_.metric(), Logits(*scratch_, data_, &attn), data_.target);
      member->set_necessity(lower_better_ ? m - report.m_circuit() : report.m_circuit() - m);
      member->set_role(canonical.count(def.label) ? "canonical" : shortcut.count(def.label) ? "shortcut" : "aiding");
      if (member->role() == "aiding") {
        for (size_t l = 0; l < attn.size(); ++l) {
          const double irr = 1.0 - attn[l].gather(-1, focus[l]).mean().item<double>();
          member->add_irrelevant_mass_delta(irr - report.irrelevant_mass(static_cast<int>(l)));
        }
      }
      if (Stopped()) return absl::CancelledError("circuit detection stopped");
    }
    return absl::OkStatus();
  }

  Opened& o_;
  const EvalData data_;
  const v1::DetectCircuitRequest& req_;
  const AnalysisProgress& progress_;
  const CancelToken* cancel_;
  std::unique_ptr<ImirModel> scratch_;
  const bool lower_better_;
  double m_ref_ = 0, estimate_ = 1;
  int64_t evals_ = 0;
};

}  // namespace

absl::StatusOr<v1::DetectCircuitResponse> ImirDetectCircuit(const v1::ExperimentSpec& spec,
                                                            const std::string& checkpoint,
                                                            const v1::DetectCircuitRequest& request,
                                                            const AnalysisProgress& progress,
                                                            const CancelToken* cancel) {
  at::set_num_threads(1);
  if (request.n_eval() == 0 || request.max_passes() == 0 || request.max_evals() == 0) {
    return absl::InvalidArgumentError("DetectCircuit needs its canonical request (n_eval, max_passes, max_evals)");
  }
  absl::StatusOr<Opened> opened = Open(spec, checkpoint, SelectionOf(request.selection()));
  if (!opened.ok()) return opened.status();
  const std::string set = request.eval_set().empty() ? PrimaryEvalSet(spec) : request.eval_set();
  absl::StatusOr<EvalData> data = MakeEval(*opened->task, set, request.n_eval(), request.seed());
  if (!data.ok()) return data.status();
  Detection detection(*opened, std::move(*data), request, progress, cancel);
  return detection.Run(spec);
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::DetectCircuitRequest, v1::DetectCircuitResponse,
                           [](const AnalysisInput& in, const v1::DetectCircuitRequest& r, const AnalysisProgress& progress, const CancelToken* cancel) { return ImirDetectCircuit(in.spec, in.checkpoint(), r, progress, cancel); });

}  // namespace circuitlab::engine
