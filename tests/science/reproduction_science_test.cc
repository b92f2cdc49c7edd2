// The recipes' ci scale (examples/reproduce/), run as a user runs them: an
// in-process server on the real engine, StartReproduction, the report. One
// definition of each experiment: E.1, E.2 (with control b in
// icl_science_test), E.3, E.6 (long), E.7, E.8, E.9, E.10 and the
// task-vector claims E.11-E.20 are decided here only (their engine-level
// tests were these same experiments); E.4 and E.5 also keep engine-level
// tests (imir_growth_test.cc) that assert more than a recipe can yet (the
// three largest coordinates, the restricted model; three ensemble seeds),
// on the experiments they read from these same recipes.
// Expected: every check passes at ci scale, as measured (closing notes of
// issue 34: E.3 rho 0.988 -> 0.053, Spearman -1, icl_rare 0.996 / 0.991;
// E.4 4 t_gamma 36 <= t_beta, t_beta 79 < t_alpha 90; E.8 t_ICL 2550 for
// the ticket, icl_rare 0.963, iwl 1, BOTH_IWL_WINS as the dense model; E.9 four labels, 16
// of 16 labelled, 3 crossings, P_mag wrong on 8, the outside coordinate
// flips 2 cells; E.10 two_hop_chain with 7 of 71 kept, m(K*) 0.952;
// E.15 KL ratio of the untrained control
// 0.9999; since issue 50, with the authors' procedure: E.9 0 order
// reversals, 3 crossings (reported); E.11 with each (token, task) cell
// drawing its own sequences (G.9 (6), 2026-12-07): eta2_task 0.767 against
// 0.392 untrained, R2_task 0.781 against 0.411, P0 ratio 0.00098 at t = 46
// against 0.012 at t = 4; E.19 last-3 ratio 0.327, prefix
// 0.0087; E.20 R2 from the CLR 0.553, with token and position 0.948, a
// random direction 0.318), except the checks KnownFailures() names, which
// fail as measured.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include "client/lib/client.h"
#include "server/reproduce/render.h"
#include "server/app/server.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab {
namespace {

// Checks of a [P] proposal that fail at ci scale on the fixed seed, as the
// report says. Asserted to fail, so that a change that makes one pass is
// seen (and the report and docs/science.md updated), never to hide it.
const std::map<std::string, std::set<std::string>>& KnownFailures() {
  // With the authors' procedure (SCIENCE.md G.9: PyTorch-default init,
  // near-disjoint majors, V_opt avoiding the task basis only), measured
  // 2026-12-06 (issue 50). E.20's "2x a random direction" is report-only now.
  static const std::map<std::string, std::set<std::string>> known = {
      // r_mean of major 1 is 0.806 (majors 0 and 2: 0.853, 0.894): the first
      // token names a near-disjoint major, so the posterior and beta are
      // ~0.99 from t = 4 on and their correlation over positions rests on
      // the first few; the KL gate separates (0.018 against 0.196 untrained).
      {"E.14", {"r_mean_task1"}},
      // V_opt kept off the task basis only takes token directions: removing
      // it costs OOD 1.32% of their CE against 3 x the majors' 0.53% (AVX2
      // machine; 2.54% against 3 x 0.92% on an AVX-512 one). Kept off the
      // token directions too (the report's dis_tok), OOD 0.47% against
      // 3 x 0.031% on AVX2 (1.57% against 3 x 0.50% on AVX-512).
      {"E.18", {"vopt_hurts_ood"}},
  };
  return known;
}

// Runs recipe `id` at its ci scale through an in-process server; every check
// must pass, except KnownFailures(), which must fail, and the recipe's
// report_only checks, which must be REPORTED (E.18's vopt_beats_floor at ci
// among them: V_opt's OOD effect is 1.32% on AVX2 and 2.54% on AVX-512 for
// the same trained model, either side of its 1.5% floor).
void ExpectEveryCheckPassesAtCiScale(const std::string& id) {
  testing::TempDir dir;
  app::ServerOptions o;
  o.data_dir = dir.path() + "/data";
  o.fronts.listen = "127.0.0.1:0";
  o.use_cuda = false;
  o.version = "science";
  o.scheduler.cpu_slots = 2;
  o.jobs.workers = 2;
  o.reproductions.tick = std::chrono::milliseconds(250);
  absl::StatusOr<std::unique_ptr<app::Server>> server = app::Server::Create(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  client::ClientOptions co;
  co.server = "127.0.0.1:" + std::to_string((*server)->port());
  co.wait_for_ready = true;
  client::Client c(co);
  v1::StartReproductionRequest req;
  req.set_recipe_id(id);
  req.set_scale("ci");
  absl::StatusOr<v1::Reproduction> r = c.StartReproduction(req);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(14);
  while (r.ok() && (r->state() == v1::REPRODUCTION_STATE_TRAINING || r->state() == v1::REPRODUCTION_STATE_ANALYSING) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    r = c.GetReproduction(r->reproduction_id());
  }
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("%s", reproduce::ReproductionText(*r).c_str());
  ASSERT_EQ(r->state(), v1::REPRODUCTION_STATE_DONE) << r->phase() << " " << r->error();
  const auto known = KnownFailures().find(id);
  std::set<std::string> reported;
  for (const v1::RecipeCheck& c : r->recipe().scales().at("ci").checks()) {
    if (c.report_only()) reported.insert(c.id());
  }
  for (const v1::CheckResult& check : r->report().checks()) {
    const bool fails = known != KnownFailures().end() && known->second.contains(check.id());
    const v1::CheckOutcome want = reported.contains(check.id()) ? v1::CHECK_OUTCOME_REPORTED
                                  : fails                       ? v1::CHECK_OUTCOME_FAIL
                                                                : v1::CHECK_OUTCOME_PASS;
    EXPECT_EQ(check.outcome(), want) << check.id() << ": " << check.expected() << "; " << check.note();
  }
  (*server)->Shutdown(std::chrono::milliseconds(100));
}

std::string RecipeTestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  name.erase(std::remove(name.begin(), name.end(), '.'), name.end());
  return name;
}

class ReproductionScienceTest : public ::testing::TestWithParam<std::string> {};
TEST_P(ReproductionScienceTest, EveryCheckPassesAtCiScale) { ExpectEveryCheckPassesAtCiScale(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Recipes, ReproductionScienceTest,
                         ::testing::Values("E.1", "E.2", "E.3", "E.4", "E.7", "E.8", "E.9", "E.10", "E.11", "E.12",
                                           "E.13", "E.14", "E.15", "E.16", "E.17", "E.18", "E.19", "E.20"),
                         RecipeTestName);

// Label `long` (not in CI): E.6's ci scale is the science tier's long
// configuration (8 points of 65536 sequences, ~3 min on a core); measured
// variant ratios 0.5052 / 0.7527 / 0.2558 / 0.6269 for phi 0.5 / 0.75 /
// 0.25 / 0.625, repair 0.9532 / 0.9270 for 0.952 / 0.929, delta = 0: 1.000,
// seeded point 0.505, identity 2.7e-14.
class ReproductionScienceLongTest : public ::testing::TestWithParam<std::string> {};
TEST_P(ReproductionScienceLongTest, EveryCheckPassesAtCiScale) { ExpectEveryCheckPassesAtCiScale(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Recipes, ReproductionScienceLongTest, ::testing::Values("E.6"), RecipeTestName);

}  // namespace
}  // namespace circuitlab
