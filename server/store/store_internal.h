// The helpers the store's table files share (not part of the Store
// interface; only server/store/*.cc include this): errors from errno, files
// written atomically, checkpoint paths, and the readers of run and coordinate
// rows with the column lists they read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store/sqlite.h"
#include "server/store/store.h"

namespace circuitlab::store {

// errno's meaning as a status: ENOSPC/EDQUOT RESOURCE_EXHAUSTED, EACCES/EPERM/
// EROFS PERMISSION_DENIED, anything else INTERNAL; `what` names the call.
absl::Status ErrnoError(const std::string& what);
// FNV-1a 64 folded to 63 bits (stored as a SQLite INTEGER).
int64_t Checksum(const std::string& bytes);
// open + fsync + close of `path` with open(2) `flags`.
absl::Status FsyncPath(const std::string& path, int flags);
// temp file + fsync + rename + fsync(dir): the file at `path` is either the
// old one or the complete new one, never a torn write.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);
// `s` with `dir` + "/" cut out of its message: clients see paths relative to
// the data directory, never where the server keeps it.
absl::Status WithoutDir(const absl::Status& s, const std::string& dir);
// A checkpoint row's path as clients see it: relative to the data directory.
std::string ShownPath(const std::string& path);
// The bytes of a checkpoint file; DATA_LOSS naming `shown` when it is gone.
absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& shown);
// The file of a checkpoint row under data directory `dir` (rows hold paths
// relative to it; older rows absolute ones, re-rooted at "checkpoints/").
std::string CheckpointFile(const std::string& dir, const std::string& path);

// The columns ReadRunRow reads, in its order.
inline constexpr const char* kRunColumns =
    "id, name, spec, state, priority, device_request, created_at, started_at, finished_at, device, error, "
    "step, total_steps, attempts, checkpoint_step, owner, ifnull(sweep_id, 0), sweep_values, warning, packed_with";
RunRow ReadRunRow(Statement& st);
// Appends the run's tags (sorted) to `row.tags`.
absl::Status LoadTags(Connection& conn, RunRow& row);

// Counts the rows of a series in a step range, then reads them keeping evenly
// spaced ranks (always the first and the last). Both statements take the same
// leading `keys` and then (min_step, max_step); rows are (step, value).
absl::Status ReadDownsampled(Connection& c, const std::string& count_sql, const std::string& rows_sql,
                             const std::vector<int64_t>& keys, int64_t min_step, int64_t max_step, int64_t max_points,
                             std::vector<int64_t>& steps, std::vector<double>& values, int64_t& total);

// The columns ReadCoordinateDef reads from column `first` on, in its order.
inline constexpr const char* kCoordinateDefColumns =
    "coord_id, coord_index, label, canonical, matrix, layer, head, block_q, block_k, element, norm, gauge";
CoordinateDefRow ReadCoordinateDef(Statement& st, int first = 0);

}  // namespace circuitlab::store
