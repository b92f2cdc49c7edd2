// The checks a request or spec field gets, worded the one way every error
// of the server names a field: "<field> must be in [lo, hi], got v".
// Header-only, torch-free.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "absl/status/status.h"

namespace circuitlab {

// `v` as the shortest text that reads it back (1e-05, 0.25, 3).
inline std::string FormatNumber(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

inline absl::Status OutOfRange(const std::string& field, double lo, double hi, double got) {
  return absl::InvalidArgumentError(field + " must be in [" + FormatNumber(lo) + ", " + FormatNumber(hi) + "], got " +
                                    FormatNumber(got));
}

// One numeric field against [lo, hi].
template <typename T>
absl::Status CheckRange(const std::string& field, T value, T lo, T hi) {
  if (!(value >= lo && value <= hi)) {
    return OutOfRange(field, static_cast<double>(lo), static_cast<double>(hi), static_cast<double>(value));
  }
  return absl::OkStatus();
}

// `value` >= `need`, saying `why` the field needs that much.
inline absl::Status AtLeast(const std::string& field, uint32_t value, uint32_t need, const std::string& why) {
  if (value < need) {
    return absl::InvalidArgumentError(field + " must be at least " + std::to_string(need) + " (" + why + "), got " +
                                      std::to_string(value));
  }
  return absl::OkStatus();
}

}  // namespace circuitlab
