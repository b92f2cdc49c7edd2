// Status propagation helpers for absl::Status / absl::StatusOr.
//
//   CL_RETURN_IF_ERROR(store->Put(row));
//   CL_ASSIGN_OR_RETURN(Run run, store->GetRun(id));
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CL_STATUS_CONCAT_INNER_(a, b) a##b
#define CL_STATUS_CONCAT_(a, b) CL_STATUS_CONCAT_INNER_(a, b)

#define CL_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status cl_status_ = (expr);          \
    if (!cl_status_.ok()) return cl_status_;     \
  } while (false)

#define CL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#define CL_ASSIGN_OR_RETURN(lhs, expr) \
  CL_ASSIGN_OR_RETURN_IMPL_(CL_STATUS_CONCAT_(cl_statusor_, __LINE__), lhs, expr)

#include <exception>
#include <string>

namespace circuitlab {

// Runs `fn` (returning absl::Status or absl::StatusOr<T>); an exception that
// escapes it becomes INTERNAL with its message, so an RPC handler always ends
// with a status a client can read (never UNKNOWN or a dropped call).
template <typename Fn>
auto CallCatching(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("internal error: ") + e.what());
  } catch (...) {
    return absl::InternalError("internal error: unknown exception");
  }
}

}  // namespace circuitlab
