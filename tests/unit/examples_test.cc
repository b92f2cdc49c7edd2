// Every file in examples/ is a valid request as shipped: experiment specs
// resolve under the default server limits, sweeps expand and every member
// resolves, Intervene requests parse. (The README points users at them.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "circuitlab/v1/analysis_service.pb.h"
#include "client/lib/client.h"
#include "server/engine/spec.h"
#include "server/scheduler/sweeps.h"

namespace circuitlab {
namespace {

TEST(ExamplesTest, EveryShippedFileIsAValidRequest) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(CIRCUITLAB_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".json") continue;
    const std::string name = entry.path().filename().string();
    std::stringstream text;
    text << std::ifstream(entry.path()).rdbuf();
    const std::string json = text.str();
    if (json.find("\"interventions\"") != std::string::npos || json.find("\"patch\"") != std::string::npos) {
      v1::InterveneRequest req;
      EXPECT_TRUE(client::ReadJsonFile(entry.path().string(), &req).ok()) << name;
      EXPECT_TRUE(req.interventions_size() > 0 || req.has_patch()) << name;
    } else if (json.find("\"axes\"") != std::string::npos) {
      v1::SweepSpec sweep;
      ASSERT_TRUE(client::ReadJsonFile(entry.path().string(), &sweep).ok()) << name;
      absl::StatusOr<std::vector<scheduler::SweepMember>> members = scheduler::ExpandSweep(sweep, 4096);
      ASSERT_TRUE(members.ok()) << name << ": " << members.status();
      EXPECT_GE(members->size(), 2u) << name;
      for (scheduler::SweepMember& m : *members) {
        absl::Status s = engine::ResolveSpec({}, &m.spec);
        EXPECT_TRUE(s.ok()) << name << ": " << s;
      }
    } else {
      v1::ExperimentSpec spec;
      ASSERT_TRUE(client::ReadJsonFile(entry.path().string(), &spec).ok()) << name;
      absl::Status s = engine::ResolveSpec({}, &spec);
      EXPECT_TRUE(s.ok()) << name << ": " << s;
    }
    ++checked;
  }
  EXPECT_GE(checked, 12);
}

}  // namespace
}  // namespace circuitlab
