// Science tests of the coordinate-parameterised IMIR model on the minimal ICL
// task of 2511.01033 (SCIENCE.md A.1.7): E.4 (growth order gamma -> beta ->
// alpha; three coordinates carry the induction head) and E.5 (emergence time
// ~ N^2, labelled long). Margins from measured runs (see the README's science
// table and the closing notes).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>

#include "client/lib/client.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/spec.h"
#include "server/engine/train/trainer.h"
#include "server/reproduce/recipes.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

// An experiment as its recipe defines it at `ci` scale (one definition: the
// sweep `sweep` of examples/reproduce/`id`.json, whose checks the
// reproduction tier runs), resolved. These tests assert what a recipe's
// checks cannot (every coordinate's magnitude, a restricted model, the
// step-size reconciliation) on the same experiments.
v1::ExperimentSpec RecipeExperiment(const std::string& id, const std::string& sweep) {
  absl::StatusOr<v1::Recipe> recipe = reproduce::FindRecipe(id);
  if (!recipe.ok()) throw std::runtime_error(std::string(recipe.status().message()));
  for (const v1::RecipeSweep& s : recipe->scales().at("ci").sweeps()) {
    if (s.name() != sweep) continue;
    v1::ExperimentSpec spec = s.sweep().base();
    const absl::Status resolved = ResolveSpec({}, &spec);
    if (!resolved.ok()) throw std::runtime_error(std::string(resolved.message()));
    return spec;
  }
  throw std::runtime_error(id + " has no sweep " + sweep + " at ci scale");
}

struct Growth {
  std::map<std::string, std::vector<double>> series;  // canonical name -> value per step (index = step)
  std::vector<double> accuracy;                       // eval/test/accuracy per evaluation
  int64_t reached = -1;                               // first evaluated step with accuracy >= target
  std::vector<double> final_values;                   // every coordinate at the end (basis order)
};

// Trains member `member`'s ensemble until every member reached `target`
// accuracy (evaluated every `eval_every` steps) or the spec's steps run out.
std::vector<Growth> TrainToTarget(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& seeds, double target,
                                  int eval_every, EnsembleTrainer** out_trainer = nullptr) {
  static std::unique_ptr<EnsembleTrainer> keep;
  keep = std::make_unique<EnsembleTrainer>(spec, seeds, torch::kCPU);
  EnsembleTrainer& trainer = *keep;
  if (out_trainer != nullptr) *out_trainer = &trainer;
  const Basis& basis = trainer.model().config().coordinates->basis;
  Projector projector(basis);
  std::vector<Growth> out(seeds.size());
  auto record = [&] {
    for (size_t e = 0; e < seeds.size(); ++e) {
      const Projection p = Project(projector, trainer.model(), static_cast<int64_t>(e));
      for (const CoordinateDef& c : basis.coords) {
        if (!c.canonical.empty()) out[e].series[c.canonical].push_back(p.values[c.index]);
      }
      out[e].final_values = p.values;
    }
  };
  record();
  while (trainer.step() < trainer.total_steps()) {
    trainer.Step(false);
    record();
    if (trainer.step() % eval_every != 0) continue;
    const auto metrics = trainer.Evaluate();
    bool all = true;
    for (size_t e = 0; e < seeds.size(); ++e) {
      const double acc = testing::MetricValue(metrics[e], "eval/test/accuracy");
      out[e].accuracy.push_back(acc);
      if (std::getenv("CIRCUITLAB_VERBOSE") != nullptr) {
        std::printf("  step %lld member %zu acc %.4f alpha %.3f beta %.3f gamma %.3f\n",
                    static_cast<long long>(trainer.step()), e, acc, out[e].series["alpha"].back(),
                    out[e].series["beta"].back(), out[e].series["gamma"].back());
      }
      if (acc >= target && out[e].reached < 0) out[e].reached = trainer.step();
      all = all && out[e].reached >= 0;
    }
    if (all) break;
  }
  return out;
}

// First step at which |x| >= fraction * |x(end)|.
int64_t FirstReach(const std::vector<double>& x, double fraction) {
  const double goal = fraction * std::abs(x.back());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::abs(x[i]) >= goal) return static_cast<int64_t>(i);
  }
  return -1;
}

// Accuracy of member `member` restricted to the coordinates `keep` (every
// other coordinate zeroed), on a fresh test batch.
double RestrictedAccuracy(const v1::ExperimentSpec& spec, const EnsembleTrainer& trainer, int64_t member,
                          const std::vector<double>& values, const std::vector<std::string>& keep) {
  v1::ExperimentSpec ticket = spec;
  auto* m = ticket.mutable_model()->mutable_imir();
  m->clear_coordinates();
  for (const std::string& name : keep) m->add_coordinates(name);
  std::unique_ptr<ImirModel> model = MakeModel(ticket, trainer.task(member), 1, torch::kCPU);
  const Basis& basis = model->config().coordinates->basis;
  for (const std::string& name : keep) {
    const int32_t id = FindCoordinate(basis, name);
    model->SetRawCoordinate(0, id, values[static_cast<size_t>(id)]);
  }
  torch::NoGradGuard no_grad;
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12345);
  const Batch b = trainer.task(member).Sample(4096, SampleMode::kTest, gen);
  torch::Tensor logits = model->Forward(b.tokens.unsqueeze(0), b.pids.unsqueeze(0))[0];
  return (logits.argmax(-1) == b.target).to(torch::kDouble).mean().item<double>();
}

// SCIENCE.md E.4 (with G.5) on the 19-coordinate model, unit-norm
// coordinates (coordinate SGD = dense SGD projected on the span), zero init,
// SGD lr 20, MSE, batch 512, N = 8. Measured (seeds 1-3): accuracy >= 0.95 at
// step 275 (1.000); gamma reaches 10% of its final value at step 9-10, beta at
// 138, alpha at 108-112; alpha, beta, gamma are the three largest
// coordinates, the next is 0.232-0.236 of gamma; restricted to the three the
// model keeps accuracy 1.000.
// Asserted: gamma first by a factor 4 (t_gamma <= t_beta / 4 and <= t_alpha /
// 4); alpha, beta, gamma the three largest with the next <= 0.3 of gamma;
// restricted accuracy >= 0.9 x full. Beta before alpha is not asserted at this
// step size (alpha crosses 10% first here); the test below reconciles the
// order with the reference prototype: it depends on the step size.
TEST(ImirGrowthTest, GammaFirstAndThreeCoordinatesCarryTheInductionHead) {
  const v1::ExperimentSpec spec = RecipeExperiment("E.4", "unit");  // N 8, unit norm, lr 20, 1500 steps
  const std::vector<uint64_t> seeds = {1, 2, 3};
  EnsembleTrainer* trainer = nullptr;
  const std::vector<Growth> runs = TrainToTarget(spec, seeds, 0.95, 25, &trainer);
  const Basis& basis = trainer->model().config().coordinates->basis;
  for (size_t e = 0; e < seeds.size(); ++e) {
    const Growth& g = runs[e];
    ASSERT_GE(g.reached, 0) << "seed " << seeds[e] << " never reached accuracy 0.95";
    const int64_t ta = FirstReach(g.series.at("alpha"), 0.1), tb = FirstReach(g.series.at("beta"), 0.1),
                  tg = FirstReach(g.series.at("gamma"), 0.1);
    // Magnitudes |c| ||B|| (C.4) of the three and of the largest other one.
    double smallest_of_three = 1e300, largest_other = 0, gamma_mag = 0;
    for (const CoordinateDef& c : basis.coords) {
      const double mag = std::abs(g.final_values[c.index]) * c.norm;
      if (c.canonical == "gamma") gamma_mag = mag;
      if (c.canonical == "alpha" || c.canonical == "beta" || c.canonical == "gamma") {
        smallest_of_three = std::min(smallest_of_three, mag);
      } else {
        largest_other = std::max(largest_other, mag);
      }
    }
    const double full = g.accuracy.back();
    const double restricted =
        RestrictedAccuracy(spec, *trainer, static_cast<int64_t>(e), g.final_values, {"alpha", "beta", "gamma"});
    std::printf(
        "seed %llu: acc >= 0.95 at step %lld (%.4f); 10%% of final: t_gamma %lld t_beta %lld t_alpha %lld; "
        "alpha %.3f beta %.3f gamma %.3f; next largest / gamma %.3f; restricted accuracy %.4f\n",
        static_cast<unsigned long long>(seeds[e]), static_cast<long long>(g.reached), full, static_cast<long long>(tg),
        static_cast<long long>(tb), static_cast<long long>(ta), g.series.at("alpha").back(), g.series.at("beta").back(),
        g.series.at("gamma").back(), largest_other / gamma_mag, restricted);
    EXPECT_GE(tg, 0);
    EXPECT_LE(4 * tg, tb);
    EXPECT_LE(4 * tg, ta);
    EXPECT_GT(smallest_of_three, largest_other);
    EXPECT_LE(largest_other, 0.3 * gamma_mag);
    EXPECT_GE(restricted, 0.9 * full);
  }
}

// SCIENCE.md E.4's order gamma -> beta -> alpha, reconciled with the reference
// Python prototype kept outside the repository (raw coordinates, zero init, SGD lr
// 1, batch 512, N 8, loss 0.5 * sum_v (logit_v - onehot_v)^2; with one BOS
// token it measured t_gamma 6 < t_beta 100 < t_alpha 121, stopping at step
// 250). This service's MSE is sum_v (logit_v - onehot_v)^2 without the 1/2,
// so its gradient is twice the prototype's: lr 0.5 here is the prototype's
// step, and there the order is the paper's -- the service measured 4/79/90 and
// 6/103/124 (seeds 1, 2; the second the prototype's numbers). At twice that
// step (lr 1 here, the prototype's lr 2) alpha catches up with beta
// (36-38 vs 39): the order depends on the step size, i.e. on the loss's
// normalisation, which the paper leaves implicit. Asserted, on the raw
// 19-coordinate model (times = first step at 10% of the value at the end):
//   both steps: t_gamma <= t_beta / 4;
//   at the prototype's step: beta leads alpha by >= 12 steps (measured 18-21,
//   seeds 1-3: 6/104/124, 6/103/124, 6/103/122);
//   at twice the step: that lead is gone (<= 2; measured -1 to -3: 2/39/38,
//   2/39/36, 2/40/37).
TEST(ImirGrowthTest, BetaBeforeAlphaAtThePrototypesStepSize) {
  struct Regime {
    double lr;
    bool beta_first;
  };
  for (const Regime& regime : {Regime{0.5, true}, Regime{1.0, false}}) {
    v1::ExperimentSpec spec = RecipeExperiment("E.4", "prototype");  // N 8, raw, lr 0.5, 3000 steps
    spec.mutable_training()->set_learning_rate(regime.lr);
    const std::vector<uint64_t> seeds = {1, 2, 3};
    const std::vector<Growth> runs = TrainToTarget(spec, seeds, 0.95, 10);
    for (size_t e = 0; e < seeds.size(); ++e) {
      const Growth& g = runs[e];
      ASSERT_GE(g.reached, 0) << "lr " << regime.lr << " seed " << seeds[e] << " never reached accuracy 0.95";
      const int64_t ta = FirstReach(g.series.at("alpha"), 0.1), tb = FirstReach(g.series.at("beta"), 0.1),
                    tg = FirstReach(g.series.at("gamma"), 0.1);
      std::printf("lr %.1f seed %llu: acc >= 0.95 at step %lld; 10%% of final: t_gamma %lld t_beta %lld t_alpha %lld\n",
                  regime.lr, static_cast<unsigned long long>(seeds[e]), static_cast<long long>(g.reached),
                  static_cast<long long>(tg), static_cast<long long>(tb), static_cast<long long>(ta));
      EXPECT_GE(tg, 0);
      EXPECT_LE(4 * tg, tb);
      if (regime.beta_first) {
        EXPECT_GE(ta - tb, 12) << "beta before alpha at the prototype's step (seed " << seeds[e] << ")";
      } else {
        EXPECT_LE(ta - tb, 2) << "alpha catches up with beta at twice the step (seed " << seeds[e] << ")";
      }
    }
  }
}

// SCIENCE.md E.5 (long): the induction head's emergence time t*(N) -- the
// first step where accuracy on 4096 fixed sequences reaches 0.5 -- grows like
// N^2. Same lr and batch for every N; slope of log t* against log N.
TEST(ImirGrowthLongTest, EmergenceTimeGrowsLikeNSquared) {
  const std::vector<int> ns = {4, 8, 16};
  const std::vector<uint64_t> seeds = {1, 2, 3};
  std::vector<double> log_n, log_t;
  for (int n : ns) {
    v1::ExperimentSpec spec = RecipeExperiment("E.5", "contexts");  // the recipe's base; its axis is N
    spec.mutable_task()->mutable_minimal_icl()->set_num_pairs(n);
    const std::vector<Growth> runs = TrainToTarget(spec, seeds, 0.5, 5);
    for (size_t e = 0; e < seeds.size(); ++e) {
      std::printf("N %d seed %llu: t* %lld\n", n, static_cast<unsigned long long>(seeds[e]),
                  static_cast<long long>(runs[e].reached));
      ASSERT_GT(runs[e].reached, 0) << "N " << n << " seed " << seeds[e] << " never reached 0.5";
      log_n.push_back(std::log(static_cast<double>(n)));
      log_t.push_back(std::log(static_cast<double>(runs[e].reached)));
    }
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < log_n.size(); ++i) {
    mx += log_n[i] / log_n.size();
    my += log_t[i] / log_t.size();
  }
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < log_n.size(); ++i) {
    sxy += (log_n[i] - mx) * (log_t[i] - my);
    sxx += (log_n[i] - mx) * (log_n[i] - mx);
  }
  const double slope = sxy / sxx;
  std::printf("slope of log t* against log N: %.3f\n", slope);
  EXPECT_GE(slope, 1.5);
  EXPECT_LE(slope, 2.5);
}

}  // namespace
}  // namespace circuitlab::engine
