// A recipe value's reductions: the rows of one seed of a table (a sweep's
// summary) reduced to one JSON value (a number, a label, a count, a slope,
// the crossings or order reversals of a label map, ...), as
// v1::ColumnValue's `reduce` names. Internal to server/reproduce; report.h
// evaluates checks with them.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "circuitlab/v1/reproduce.pb.h"
#include "nlohmann/json.hpp"

namespace circuitlab::reproduce {

// A table's rows grouped by seed index, and its columns by name.
struct SeedView {
  const v1::GetSweepSummaryResponse* table = nullptr;
  int seed_axis = -1;
  std::vector<double> seeds;  // distinct seed values, ascending

  int SeedIndex(const v1::SweepRow& row) const {
    if (seed_axis < 0) return 0;
    const double s = row.swept(seed_axis).number_value();
    return static_cast<int>(std::lower_bound(seeds.begin(), seeds.end(), s) - seeds.begin());
  }
  int Column(const std::string& name) const {
    for (int i = 0; i < table->columns_size(); ++i) {
      if (table->columns(i) == name) return i;
    }
    return -1;
  }
  int Axis(const std::string& name) const {
    for (int i = 0; i < table->axes_size(); ++i) {
      if (table->axes(i) == name) return i;
    }
    return -1;
  }
};

// The table with its seeds found (the axis kSeedAxis; one seed without it).
SeedView ViewOf(const v1::GetSweepSummaryResponse& t);
// `rows` (one seed's) reduced as `c.reduce` says; null with `why` set when
// it cannot be measured.
nlohmann::json Reduce(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, const v1::ColumnValue& c,
                      std::string* why);
// Reduce within each group of rows (by the group_by axes), then across the
// groups' numbers (c.across).
nlohmann::json Grouped(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, const v1::ColumnValue& c,
                       std::string* why);
// Whether `row` has every axis value of c.where.
bool Matches(const v1::SweepRow& row, const SeedView& view, const v1::ColumnValue& c);

}  // namespace circuitlab::reproduce
