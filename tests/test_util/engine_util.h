// Helpers for tests that drive the engine directly.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "client/lib/client.h"
#include "server/engine/api.h"
#include "server/engine/spec.h"

namespace circuitlab::testing {

// A spec from protobuf JSON, resolved as the server resolves it; a test
// failure (not a crash) when it does not parse or validate.
inline v1::ExperimentSpec ResolvedSpec(const std::string& json) {
  auto spec = client::ParseSpecJson(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  const absl::Status s = engine::ResolveSpec({}, &*spec);
  EXPECT_TRUE(s.ok()) << s;
  return *spec;
}

// An AnalyzeTaskVectors request with no analysis asked and every default
// filled in as the scheduler resolves it (scheduler/analyses/task_vectors.cc),
// seed 1: what the engine's entry points take.
inline v1::AnalyzeTaskVectorsRequest TaskVectorDefaults() {
  v1::AnalyzeTaskVectorsRequest r;
  r.set_hook("post_mlp");
  r.set_estimation_hook("post_attn");
  r.set_injection_hook("post_attn");
  r.set_dissociation_hook("post_attn");
  r.set_samples_per_cell(128);
  r.set_p3_samples(512);
  r.set_steering_samples(2000);
  r.set_steering_est_samples(256);
  r.set_steering_subtract("true_task");
  r.set_ood_tasks(32);
  r.set_ood_samples(16);
  r.set_kl_samples(512);
  r.set_p_common(0.9);
  r.set_probe_samples(1000);
  r.set_eval_samples(200);
  r.set_opt_steps(200);
  r.set_opt_target("minor");
  r.set_stats_samples(500);
  r.set_dyck_masks(10);
  r.set_dyck_prefix(3);
  r.set_seed(1);
  return r;
}

// Every evaluation metric a trainer recorded is one EvalMetricNames lists
// for its spec (what SubmitRun checks training.stop_metric against).
inline void ExpectEvalMetricsListed(const v1::ExperimentSpec& spec, const std::vector<engine::Metric>& recorded) {
  const std::vector<std::string> names = engine::EvalMetricNames(spec);
  int eval = 0;
  for (const engine::Metric& m : recorded) {
    if (m.name.rfind("eval/", 0) != 0) continue;
    ++eval;
    EXPECT_NE(std::find(names.begin(), names.end(), m.name), names.end()) << m.name << " is not listed";
  }
  EXPECT_GT(eval, 0);
}

// The value of metric `name`; a test failure (and NaN) when it is missing.
inline double MetricValue(const std::vector<engine::Metric>& metrics, const std::string& name) {
  for (const auto& m : metrics) {
    if (m.name == name) return m.value;
  }
  ADD_FAILURE() << "no metric " << name;
  return std::nan("");
}

}  // namespace circuitlab::testing
