// A reproduction's checks evaluated on its tables: pure functions of the
// data (no store, no jobs), so that the science tests and the unit tests
// decide a claim exactly as the server does.
//
// A table is a recipe sweep's summary (GetSweepSummaryResponse) whose
// columns hold every column the checks read: summary columns, analysis
// fields ("<analysis>.<path>") and metric series ("series:<metric>", each
// cell a list of [step, value] pairs). Its axes include "seed"; the rows of
// the i-th smallest seed are the i-th seed's.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "circuitlab/v1/reproduce.pb.h"
#include "google/protobuf/struct.pb.h"
#include "nlohmann/json.hpp"
#include "server/reproduce/json_fields.h"  // Tables, kSeedAxis, FieldAt, ToJson

namespace circuitlab::reproduce {

// The value per seed (`seeds` of them); null where it cannot be measured,
// with the reason appended to `why` (may be null).
std::vector<nlohmann::json> ValuePerSeed(const v1::RecipeValue& value, const Tables& tables, int seeds,
                                         std::vector<std::string>* why);

// The check over `seeds` seeds; `earlier` holds the outcomes of the checks
// before it (for `needs`).
v1::CheckResult EvaluateCheck(const v1::RecipeCheck& check, const Tables& tables, int seeds,
                              const std::map<std::string, v1::CheckOutcome>& earlier);

// The report of a scale's checks, in order (tables and notes included).
v1::ReproductionReport EvaluateChecks(const v1::RecipeScale& scale, const Tables& tables, int seeds,
                                      std::vector<std::string> notes);

// The most a stored report holds (docs/reference/limits.md).
inline constexpr int64_t kMaxReportBytes = 1 << 20;

// The least the report of `scale` at `seeds` seeds holds whatever the runs
// measure: each check's texts once and its constants once per seed and in
// `expected`. A recipe over kMaxReportBytes is refused before it starts.
int64_t MinReportBytes(const v1::RecipeScale& scale, int seeds);

// Brings `report` to at most `max_bytes` serialized: drops the largest
// tables first, then the largest checks' per-seed values (their outcome,
// mean, min and max stay), then notes, each with a note that says what went
// and where to find it.
void BoundReport(v1::ReproductionReport* report, int64_t max_bytes);

}  // namespace circuitlab::reproduce
