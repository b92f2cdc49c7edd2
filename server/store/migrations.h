// Numbered schema migrations, applied in order at start-up inside
// transactions; the database's PRAGMA user_version records how many ran.
#pragma once

#include "absl/status/status.h"
#include "server/store/sqlite.h"

namespace circuitlab::store {

// Applies every migration newer than the database. FailedPrecondition when the
// database is newer than this binary.
absl::Status Migrate(Connection& conn);

}  // namespace circuitlab::store
