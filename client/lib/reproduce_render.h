// A reproduction as text (the CLI's `reproduce show`), Markdown (the
// reports under docs/reproductions/) and CSV (one line per check and seed).
#pragma once

#include <string>

#include "circuitlab/v1/reproduce.pb.h"

namespace circuitlab::client {

std::string ReproductionText(const v1::Reproduction& r);
// The one line `reproduce run --watch` prints as it goes.
std::string ReproductionProgressLine(const v1::Reproduction& r);
std::string ReproductionMarkdown(const v1::Reproduction& r);
std::string ReproductionCsv(const v1::Reproduction& r);

}  // namespace circuitlab::client
