// Interventions on the regression decoder of an E2 run (SCIENCE.md B.3,
// D.6): the ops at hook points of the mapsto layout, scored with the
// squared-error analogues against the set's Bayes predictor.
#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "server/common/seeds.h"
#include "server/common/text.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/analysis/decoder_op_steps.h"
#include "server/engine/analysis/registry.h"
#include "server/engine/setup/decoder_setup.h"
#include "server/engine/setup/checkpoint_io.h"

namespace circuitlab::engine {

namespace {

// Per ⊢ position (per_position): squared error, shift and distance to the
// reference, summed over sequences (rows of [kSeries, points]).
enum { kLossClean, kLoss, kShift, kRefClean, kRef, kSeries };

// A regression run's op rule: no replace-convex.
absl::Status NoConvex(const v1::Intervention& op, const HookPoint&, const std::string& field) {
  if (op.op() != v1::Intervention::OP_REPLACE_CONVEX) return absl::OkStatus();
  return absl::FailedPreconditionError(field + ": OP_REPLACE_CONVEX takes DICE and MARKOV runs (an E2 run's "
                                       "per-task mean states carry almost none of its state; see the steering "
                                       "analysis)");
}

// The set's Bayes predictor of every y_i [n, points]: retrieval over the
// known tasks on the majors, ridge elsewhere.
torch::Tensor BayesReference(const RegressionTaskGenerator& task, const RegressionBatch& eval, bool major) {
  const int64_t n = eval.x.size(0);
  std::vector<torch::Tensor> refs;
  for (int64_t b = 0; b < n; b += kInterveneBayesChunk) {
    const int64_t c = std::min(kInterveneBayesChunk, n - b);
    torch::Tensor x = eval.x.narrow(0, b, c), y = eval.y.narrow(0, b, c);
    refs.push_back(major ? task.KnownPool(x, y).mean : task.Ridge(x, y));
  }
  return torch::cat(refs, 0);
}

// The per-position means `series` [kSeries, points] as the effect's
// positions (the ⊢ positions `answers`).
void AddPositions(const torch::Tensor& series, const std::vector<int64_t>& answers, v1::InterventionEffect& e) {
  for (int64_t i = 0; i < series.size(1); ++i) {
    auto v = [&](int row) { return series[row][i].item<double>(); };
    v1::PositionEffect* p = e.add_positions();
    p->set_position(static_cast<uint32_t>(answers[static_cast<size_t>(i)]));
    p->set_loss_clean(v(kLossClean));
    p->set_loss(v(kLoss));
    p->set_kl_clean(v(kShift));
    p->set_kl_ref_clean(v(kRefClean));
    p->set_kl_ref(v(kRef));
  }
}

// The summed squared error of the predictions of `inputs` [n, T, d + 1]
// (with the ops `with`) against y [n, points].
double SquaredError(const DecoderModel& model, const torch::Tensor& inputs, const torch::Tensor& y,
                    const std::vector<PreparedOp>& with) {
  const int64_t n = inputs.size(0);
  double sum = 0;
  for (int64_t b = 0; b < n; b += kInterveneChunk) {
    const int64_t count = std::min(kInterveneChunk, n - b);
    const HookFn edit = EditHook(with, b);
    torch::Tensor pred =
        DecoderModel::Predictions(model.Forward(inputs.narrow(0, b, count).unsqueeze(0), with.empty() ? nullptr : &edit))
            .squeeze(0)
            .to(torch::kDouble);
    sum += (pred - y.narrow(0, b, count)).pow(2).mean(1).sum().item<double>();
  }
  return sum;
}

}  // namespace

absl::StatusOr<v1::InterveneResponse> InterveneRegression(const DecoderModel& model,
                                                          const RegressionTaskGenerator& task,
                                                          const v1::InterveneRequest& request) {
  torch::NoGradGuard no_grad;
  const int64_t points = task.num_points(), T = 3 * points;
  const SetIndex index(task.num_minors() > 0);
  absl::StatusOr<std::vector<PreparedOp>> prepared = PrepareOps(request, model.config(), T, index, NoConvex);
  if (!prepared.ok()) return prepared.status();
  std::vector<PreparedOp>& ops = *prepared;
  const std::vector<int64_t> answers = RegressionAnswers(points);
  absl::StatusOr<std::vector<AttentionMassMeter>> meters = PrepareMass(request, model.config(), T, answers);
  if (!meters.ok()) return meters.status();
  absl::StatusOr<PatchPlan> patch = PreparePatch(request, model.config(), T, answers, index);
  if (!patch.ok()) return patch.status();
  if (!request.logit_diff_tokens().empty()) {
    return absl::FailedPreconditionError("logit_diff_tokens: a regression run predicts a number, it has no logits");
  }
  absl::StatusOr<std::vector<int>> chosen = index.Chosen(request.eval_sets());
  if (!chosen.ok()) return chosen.status();

  const int64_t n = request.n_eval();
  auto draw = [&](int i, const char* purpose) {
    torch::Generator gen = MakeGenerator(DeriveSeed63(request.seed(), purpose, static_cast<uint64_t>(i)));
    const LatentPool pool = index.sets[static_cast<size_t>(i)].pool;
    return task.SamplePool(pool, torch::arange(n, torch::kLong).remainder(task.pool(pool).size(0)), gen);
  };
  v1::InterveneResponse response;
  for (int si : *chosen) {
    const RegressionBatch eval = draw(si, "intervene/eval");
    const torch::Tensor inputs = MemberInputs(model, eval.x, eval.y);  // [n, T, d + 1]
    absl::Status s = CaptureReferences(
        ops, model, si, n, T, request.seed(),
        [&](const PreparedOp& p) { return p.op->reference_set().empty() ? si : index.Find(p.op->reference_set()); },
        [&](int ri) {
          const RegressionBatch ref = draw(ri, "intervene/reference");
          return MemberInputs(model, ref.x, ref.y);
        });
    if (!s.ok()) return s;
    // The set's Bayes predictor: retrieval over the known tasks on id, ridge elsewhere.
    const bool major = index.sets[static_cast<size_t>(si)].pool == LatentPool::kMajor;
    const torch::Tensor bayes = BayesReference(task, eval, major);  // [n, points]
    double loss_clean = 0, loss = 0, shift = 0, to_ref_clean = 0, to_ref = 0;
    torch::Tensor series = torch::zeros({kSeries, points}, torch::kDouble);
    std::vector<AttentionMassMeter> clean_mass = FreshCopies(*meters), hit_mass = FreshCopies(*meters);
    const HookFn clean_hook = MeteredHook(nullptr, clean_mass);
    for (int64_t b = 0; b < n; b += kInterveneChunk) {
      const int64_t count = std::min(kInterveneChunk, n - b);
      torch::Tensor chunk = inputs.narrow(0, b, count).unsqueeze(0);
      const HookFn edit = EditHook(ops, b), metered = MeteredHook(&edit, hit_mass);
      torch::Tensor clean = DecoderModel::Predictions(model.Forward(chunk, &clean_hook)).squeeze(0).to(torch::kDouble);
      // No ops (a patch sweep, a read-out of attention mass): one forward.
      torch::Tensor edited =
          ops.empty() ? clean : DecoderModel::Predictions(model.Forward(chunk, &metered)).squeeze(0).to(torch::kDouble);
      torch::Tensor y = eval.y.narrow(0, b, count), q = bayes.narrow(0, b, count);
      auto sq = [&](const torch::Tensor& a, const torch::Tensor& c, int row) {
        const torch::Tensor per = (a - c).pow(2);  // [count, points]
        if (request.per_position()) series[row] += per.sum(0);
        return per.mean(1).sum().item<double>();
      };
      loss_clean += sq(clean, y, kLossClean);
      loss += sq(edited, y, kLoss);
      shift += sq(edited, clean, kShift);
      to_ref_clean += sq(clean, q, kRefClean);
      to_ref += sq(edited, q, kRef);
    }
    if (ops.empty()) hit_mass = clean_mass;
    v1::InterventionEffect& e = *response.add_effects();
    ReportMass(clean_mass, hit_mass, request.per_position(), e);
    const double dn = static_cast<double>(n);
    e.set_eval_set(index.sets[static_cast<size_t>(si)].name);
    e.set_loss_clean(loss_clean / dn);
    e.set_loss(loss / dn);
    e.set_kl_clean(shift / dn);
    e.set_has_kl_ref(true);
    e.set_ref_name(major ? "bayes" : "ridge");
    e.set_kl_ref_clean(to_ref_clean / dn);
    e.set_kl_ref(to_ref / dn);
    if (request.per_position()) AddPositions(series / dn, answers, e);
    if (!request.has_patch()) continue;
    const std::string& from = request.patch().reference_set();
    const RegressionBatch source = draw(from.empty() ? si : index.Find(from), "intervene/reference");
    auto score = [&](const torch::Tensor& in, const std::vector<PreparedOp>& with) {
      return PatchScores{SquaredError(model, in, eval.y, with) / dn, 0, 0};
    };
    s = DecoderPatch(model, *patch, n, T, inputs, MemberInputs(model, source.x, source.y), {e.loss_clean(), 0, 0},
                     score, e);
    if (!s.ok()) return s;
  }
  return response;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("regression", v1::InterveneRequest, v1::InterveneResponse,
                           [](const AnalysisInput& in, const v1::InterveneRequest& r, const AnalysisProgress&,
                              const CancelToken*) {
                             return WithDecoder<RegressionTaskGenerator>(
                                 in, [&](const DecoderModel& m, const RegressionTaskGenerator& t) {
                                   if (r.has_prompts()) {
                                     return absl::StatusOr<v1::InterveneResponse>(absl::FailedPreconditionError(
                                         "prompts: a regression run reads vectors, not token prompts"));
                                   }
                                   return InterveneRegression(m, t, r);
                                 });
                           });

}  // namespace circuitlab::engine
