// main() of the LibTorch test binaries: the same runtime settings as the
// server (one intra-op thread, OpenBLAS pinned, malloc thresholds), so test
// timings mean what server timings mean.
#include <gtest/gtest.h>

#include "server/engine/api.h"

int main(int argc, char** argv) {
  circuitlab::engine::ConfigureRuntime(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
