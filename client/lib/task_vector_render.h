// Renderings of an AnalyzeTaskVectors answer: CSV with every value, and a
// compact text summary for people (scalars in full, per-position series at a
// few positions; --csv has them all).
#pragma once

#include <string>

#include "circuitlab/v1/analysis_service.pb.h"

namespace circuitlab::client {

// Header run_id,step,sweep_values,name,layer,position,value; one line a value.
std::string TaskVectorCsv(const v1::AnalyzeTaskVectorsResponse& response);

// Per (run, step): one line per (name, layer), series shown at up to 8
// positions.
std::string TaskVectorText(const v1::AnalyzeTaskVectorsResponse& response);

}  // namespace circuitlab::client
