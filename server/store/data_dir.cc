#include "server/store/store.h"

// Opening, locking, checking and copying a data directory. The writer thread
// is Store::Impl's (store_impl.cc); the tables live one per file: runs.cc,
// metrics.cc, checkpoints.cc, analyses.cc, reproductions.cc.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "server/common/status_macros.h"
#include "server/store/migrations.h"
#include "server/store/sqlite.h"
#include "server/store/store_impl.h"
#include "server/store/store_internal.h"

namespace circuitlab::store {
namespace fs = std::filesystem;

namespace {

// Start-up checks: SQLite's own quick_check, and the database against the
// checkpoint directories on disk. A directory checkpoints/rN for a run the
// database never numbered (N beyond its id sequence) means the database lost
// runs, e.g. circuitlab.db copied without its -wal file while the server ran:
// starting would reuse rN next to the lost run's files, so refuse.
absl::Status CheckIntegrity(Connection& conn, const std::string& data_dir) {
  {
    CL_ASSIGN_OR_RETURN(Statement st, conn.Prepare("PRAGMA quick_check"));
    CL_ASSIGN_OR_RETURN(bool row, st.Step());
    const std::string verdict = row ? st.ColumnText(0) : "no answer";
    if (verdict != "ok") {
      return absl::DataLossError(data_dir + "/circuitlab.db fails SQLite's integrity check (" + verdict +
                                 "); restore it from a backup (docs/howto/backup.md)");
    }
  }
  int64_t last_id = 0;
  {
    CL_ASSIGN_OR_RETURN(Statement st,
                        conn.Prepare("SELECT ifnull(max(seq), 0) FROM sqlite_sequence WHERE name = 'runs'"));
    CL_ASSIGN_OR_RETURN(bool row, st.Step());
    if (row) last_id = st.ColumnInt(0);
  }
  std::vector<int64_t> lost;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(data_dir + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    if (!e.is_directory() || name.size() < 2 || name.size() > 19 || name[0] != 'r' ||
        !std::all_of(name.begin() + 1, name.end(), digit)) {
      continue;
    }
    const int64_t id = std::stoll(name.substr(1));
    if (id > last_id) lost.push_back(id);
  }
  if (!lost.empty()) {
    std::sort(lost.begin(), lost.end());
    return absl::FailedPreconditionError(
        data_dir + "/circuitlab.db has lost runs that the disk still holds (checkpoints/r" +
        std::to_string(lost.front()) + (lost.size() > 1 ? " .. r" + std::to_string(lost.back()) : std::string()) +
        ", beyond the database's last run r" + std::to_string(last_id) +
        "): was it copied without its -wal file? Restore a backup (circuitlab-server --backup) or move those "
        "directories away before starting");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Store::Backup(const std::string& data_dir, const std::string& dest_dir) {
  std::error_code ec;
  // A copy inside the directory it copies would copy itself, and grow, until
  // the disk is full (issue 32 item 5).
  std::error_code data_ec, dest_ec;
  const fs::path data = fs::weakly_canonical(data_dir, data_ec), dest = fs::weakly_canonical(dest_dir, dest_ec);
  if (!data_ec && !dest_ec && !data.empty() &&
      std::mismatch(data.begin(), data.end(), dest.begin(), dest.end()).first == data.end()) {
    return absl::InvalidArgumentError("--backup " + dest_dir + " is inside --data " + data_dir +
                                      "; back up into a directory outside it");
  }
  if (fs::exists(dest_dir + "/circuitlab.db", ec)) {
    return absl::AlreadyExistsError(dest_dir + "/circuitlab.db exists; back up into a new directory");
  }
  const bool made = !fs::exists(dest_dir, ec), made_checkpoints = !fs::exists(dest_dir + "/checkpoints", ec);
  fs::create_directories(dest_dir + "/checkpoints", ec);
  if (ec) return absl::PermissionDeniedError("cannot create " + dest_dir + ": " + ec.message());
  absl::Status copied = CopyInto(data_dir, dest_dir);
  // A failed backup leaves no half copy behind (only what it created).
  if (!copied.ok()) {
    if (made) {
      fs::remove_all(dest_dir, ec);
    } else {
      fs::remove(dest_dir + "/circuitlab.db", ec);
      if (made_checkpoints) fs::remove_all(dest_dir + "/checkpoints", ec);
    }
  }
  return copied;
}

absl::Status Store::CopyInto(const std::string& data_dir, const std::string& dest_dir) {
  std::error_code ec;
  // A consistent snapshot through a read-only connection: the server may be
  // running (WAL lets it go on writing meanwhile).
  if (!fs::exists(data_dir + "/circuitlab.db", ec)) {
    return absl::NotFoundError(data_dir + "/circuitlab.db does not exist");
  }
  // Read-only needs the -wal and -shm files a running server keeps; with the
  // server stopped, a writing connection (which creates them) is as safe.
  absl::StatusOr<std::unique_ptr<Connection>> conn = Connection::Open(data_dir + "/circuitlab.db", false);
  if (!conn.ok()) conn = Connection::Open(data_dir + "/circuitlab.db", true);
  if (!conn.ok()) return conn.status();
  std::string quoted = dest_dir + "/circuitlab.db";
  for (size_t i = 0; (i = quoted.find('\'', i)) != std::string::npos; i += 2) quoted.insert(i, "'");
  CL_RETURN_IF_ERROR((*conn)->Exec("VACUUM INTO '" + quoted + "'"));
  // Then the checkpoint files (written once, atomically): those the snapshot
  // points at and any newer. One pruned meanwhile is passed over on resume.
  fs::copy(data_dir + "/checkpoints", dest_dir + "/checkpoints",
           fs::copy_options::recursive | fs::copy_options::skip_existing, ec);
  if (ec) return absl::DataLossError("copying the checkpoints into " + dest_dir + ": " + ec.message());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& data_dir, StoreOptions options) {
  std::error_code ec;
  fs::create_directories(data_dir + "/checkpoints", ec);
  if (ec) return absl::PermissionDeniedError("cannot create data directory " + data_dir + ": " + ec.message());
  const std::string lock_path = data_dir + "/LOCK";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return ErrnoError("open " + lock_path);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd);
    return absl::FailedPreconditionError("data directory " + data_dir +
                                         " is in use by another circuitlab-server (lock " + lock_path + ")");
  }
  auto conn = Connection::Open(data_dir + "/circuitlab.db", /*read_write=*/true);
  if (!conn.ok()) {
    ::close(lock_fd);
    return conn.status();
  }
  if (absl::Status s = Migrate(**conn); !s.ok()) {
    ::close(lock_fd);
    return s;
  }
  if (absl::Status s = CheckIntegrity(**conn, data_dir); !s.ok()) {
    ::close(lock_fd);
    return s;
  }
  auto impl = std::make_unique<Impl>(data_dir, options, lock_fd, std::move(*conn));
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

const std::string& Store::data_dir() const { return impl_->dir(); }

absl::Status Store::Flush() {
  return impl_->Write([](Connection&) { return absl::OkStatus(); });
}

Store::WriteStats Store::GetWriteStats() const { return impl_->Stats(); }

}  // namespace circuitlab::store
