// Helpers for tests that drive the engine directly.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "client/lib/client.h"
#include "server/engine/engine.h"
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

// The value of metric `name`; a test failure (and NaN) when it is missing.
inline double MetricValue(const std::vector<engine::Metric>& metrics, const std::string& name) {
  for (const auto& m : metrics) {
    if (m.name == name) return m.value;
  }
  ADD_FAILURE() << "no metric " << name;
  return std::nan("");
}

}  // namespace circuitlab::testing
