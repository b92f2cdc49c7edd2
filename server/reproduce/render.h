// A reproduction as text (the CLI's `reproduce show`), Markdown (the reports
// under docs/reproductions/, the CLI's --markdown and the HTTP gateway's
// GET /api/v1/reproductions/{id}/report.md) and CSV (one line per check and
// seed). Protobuf and the standard library only: its own library
// (circuitlab_reproduce_render), which the client links too.
#pragma once

#include <string>

#include "circuitlab/v1/reproduce.pb.h"

namespace circuitlab::reproduce {

std::string ReproductionText(const v1::Reproduction& r);
// The one line `reproduce run --watch` prints as it goes.
std::string ReproductionProgressLine(const v1::Reproduction& r);
std::string ReproductionMarkdown(const v1::Reproduction& r);
std::string ReproductionCsv(const v1::Reproduction& r);

}  // namespace circuitlab::reproduce
