// A spec from protobuf JSON, resolved as the server resolves it; a test
// failure (not a crash) when it does not parse or validate.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "client/lib/client.h"
#include "server/engine/spec.h"

namespace circuitlab::testing {

inline v1::ExperimentSpec ResolvedSpec(const std::string& json) {
  auto spec = client::ParseSpecJson(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  const absl::Status s = engine::ResolveSpec({}, &*spec);
  EXPECT_TRUE(s.ok()) << s;
  return *spec;
}

}  // namespace circuitlab::testing
