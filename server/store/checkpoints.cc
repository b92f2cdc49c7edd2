#include "server/store/store.h"

// Checkpoints: files written atomically under checkpoints/r<id>/, indexed
// (step, path, size, checksum) in the checkpoints table.

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "server/common/clock.h"
#include "server/common/status_macros.h"
#include "server/store/sqlite.h"
#include "server/store/store_impl.h"
#include "server/store/store_internal.h"

namespace circuitlab::store {
namespace fs = std::filesystem;
absl::Status Store::PutCheckpoint(int64_t run_id, int64_t step, const std::string& bytes, int keep) {
  // Rows hold the path relative to the data directory, so the directory can
  // move (a container volume mounted elsewhere, a restored backup).
  const std::string relative_dir = "checkpoints/r" + std::to_string(run_id);
  const std::string dir = impl_->dir() + "/" + relative_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError("cannot create " + relative_dir + ": " + ec.message());
  char name[64];
  std::snprintf(name, sizeof(name), "/step-%012lld.ckpt", static_cast<long long>(step));
  const std::string path = relative_dir + name;
  CL_RETURN_IF_ERROR(WithoutDir(WriteFileAtomically(impl_->dir() + "/" + path, bytes), impl_->dir()));
  const int64_t checksum = Checksum(bytes);
  const int64_t now = Clock::Real()->NowMicros();
  std::vector<std::string> doomed;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO checkpoints(run_id, step, path, size_bytes, "
                                                  "checksum, created_at) VALUES (?,?,?,?,?,?)"));
      st.Bind(1, run_id).Bind(2, step).Bind(3, path).Bind(4, static_cast<int64_t>(bytes.size()));
      st.Bind(5, checksum).Bind(6, now);
      CL_RETURN_IF_ERROR(st.Run());
    }
    {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("UPDATE runs SET checkpoint_step = ? WHERE id = ?"));
      st.Bind(1, step).Bind(2, run_id);
      CL_RETURN_IF_ERROR(st.Run());
    }
    if (keep > 0) {
      CL_ASSIGN_OR_RETURN(Statement sel, c.Prepare("SELECT path FROM checkpoints WHERE run_id = ? ORDER BY step DESC "
                                                   "LIMIT -1 OFFSET ?"));
      sel.Bind(1, run_id).Bind(2, int64_t{keep});
      while (true) {
        CL_ASSIGN_OR_RETURN(bool more, sel.Step());
        if (!more) break;
        doomed.push_back(sel.ColumnText(0));
      }
      CL_ASSIGN_OR_RETURN(Statement del, c.Prepare("DELETE FROM checkpoints WHERE run_id = ? AND step NOT IN "
                                                   "(SELECT step FROM checkpoints WHERE run_id = ? ORDER BY step "
                                                   "DESC LIMIT ?)"));
      del.Bind(1, run_id).Bind(2, run_id).Bind(3, int64_t{keep});
      CL_RETURN_IF_ERROR(del.Run());
    }
    return absl::OkStatus();
  }));
  // Files go only after the rows that pointed at them are gone.
  for (const std::string& p : doomed) fs::remove(CheckpointFile(impl_->dir(), p), ec);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Checkpoint>> Store::LatestCheckpoint(int64_t run_id) { return CheckpointAt(run_id, -1); }

absl::StatusOr<std::optional<Checkpoint>> Store::CheckpointAt(int64_t run_id, int64_t step) {
  std::string path;
  int64_t size = 0, checksum = 0;
  {
    CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
    // step < 0 means the newest.
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT step, path, size_bytes, checksum FROM checkpoints WHERE "
                                                 "run_id = ?1 AND (?2 < 0 OR step = ?2) ORDER BY step DESC LIMIT 1"));
    st.Bind(1, run_id).Bind(2, step);
    CL_ASSIGN_OR_RETURN(bool found, st.Step());
    if (!found) return std::optional<Checkpoint>();
    step = st.ColumnInt(0);
    path = st.ColumnText(1);
    size = st.ColumnInt(2);
    checksum = st.ColumnInt(3);
  }
  CL_ASSIGN_OR_RETURN(std::string bytes, ReadFile(CheckpointFile(impl_->dir(), path), ShownPath(path)));
  if (static_cast<int64_t>(bytes.size()) != size || Checksum(bytes) != checksum) {
    return absl::DataLossError("checkpoint " + ShownPath(path) + " does not match its checksum (" +
                               std::to_string(bytes.size()) + " of " + std::to_string(size) + " bytes)");
  }
  return std::optional<Checkpoint>(Checkpoint{step, std::move(bytes)});
}

absl::StatusOr<std::optional<Checkpoint>> Store::LatestIntactCheckpoint(int64_t run_id,
                                                                        std::vector<std::string>* skipped) {
  CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, CheckpointSteps(run_id));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::StatusOr<std::optional<Checkpoint>> c = CheckpointAt(run_id, *it);
    if (c.ok() && *c) return c;
    if (c.ok() || c.status().code() == absl::StatusCode::kDataLoss) {
      skipped->push_back("step " + std::to_string(*it) + ": " +
                         (c.ok() ? std::string("gone") : std::string(c.status().message())));
      continue;
    }
    return c.status();  // the database itself failed
  }
  return std::optional<Checkpoint>();
}

absl::StatusOr<std::vector<int64_t>> Store::CheckpointSteps(int64_t run_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT step FROM checkpoints WHERE run_id = ? ORDER BY step"));
  st.Bind(1, run_id);
  std::vector<int64_t> steps;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    steps.push_back(st.ColumnInt(0));
  }
  return steps;
}

}  // namespace circuitlab::store
