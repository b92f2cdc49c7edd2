#include "server/store/store_internal.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/common/status_macros.h"

namespace circuitlab::store {
namespace fs = std::filesystem;

absl::Status ErrnoError(const std::string& what) {
  int e = errno;
  std::string msg = what + ": " + std::strerror(e);
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (e == EACCES || e == EPERM || e == EROFS) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// FNV-1a 64 folded to 63 bits (stored as a SQLite INTEGER).
int64_t Checksum(const std::string& bytes) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001B3ULL;
  }
  return static_cast<int64_t>(h >> 1);
}

absl::Status FsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return ErrnoError("open " + path);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync " + path);
  return absl::OkStatus();
}

// temp file + fsync + rename + fsync(dir): the file at `path` is either the old
// one or the complete new one, never a torn write.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create " + tmp);
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("write " + tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = ErrnoError("fsync " + tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp);
  return FsyncPath(fs::path(path).parent_path().string(), O_RDONLY | O_DIRECTORY);
}

// `s` with `dir` + "/" cut out of its message: clients see paths relative
// to the data directory, never where the server keeps it.
absl::Status WithoutDir(const absl::Status& s, const std::string& dir) {
  if (s.ok()) return s;
  std::string msg(s.message());
  const std::string prefix = dir + "/";
  for (size_t at = msg.find(prefix); at != std::string::npos; at = msg.find(prefix, at)) msg.erase(at, prefix.size());
  return absl::Status(s.code(), msg);
}

// A checkpoint row's path as clients see it: relative to the data directory
// (rows written before paths were relative hold absolute ones).
std::string ShownPath(const std::string& path) {
  const size_t at = path.rfind("checkpoints/r");
  return path.empty() || path[0] != '/' || at == std::string::npos ? path : path.substr(at);
}

// `shown`: the name error messages use.
absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& shown) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::DataLossError("checkpoint file missing: " + shown);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The file of a checkpoint row under data directory `dir`. Rows hold paths
// relative to it; rows written before that hold absolute paths, which are
// taken from their "checkpoints/" part on so that a moved directory still
// finds its files.
std::string CheckpointFile(const std::string& dir, const std::string& path) {
  if (path.empty() || path[0] != '/') return dir + "/" + path;
  const size_t at = path.rfind("/checkpoints/r");
  return at == std::string::npos ? path : dir + path.substr(at);
}

RunRow ReadRunRow(Statement& st) {
  RunRow r;
  r.id = st.ColumnInt(0);
  r.name = st.ColumnText(1);
  r.spec = st.ColumnBlob(2);
  r.state = static_cast<int>(st.ColumnInt(3));
  r.priority = static_cast<int>(st.ColumnInt(4));
  r.device_request = static_cast<int>(st.ColumnInt(5));
  r.created_at_us = st.ColumnInt(6);
  r.started_at_us = st.ColumnInt(7);
  r.finished_at_us = st.ColumnInt(8);
  r.device = st.ColumnText(9);
  r.error = st.ColumnText(10);
  r.step = st.ColumnInt(11);
  r.total_steps = st.ColumnInt(12);
  r.attempts = static_cast<int>(st.ColumnInt(13));
  r.checkpoint_step = st.ColumnInt(14);
  r.owner = st.ColumnText(15);
  r.sweep_id = st.ColumnInt(16);
  r.sweep_values = st.ColumnText(17);
  r.warning = st.ColumnText(18);
  r.packed_with = st.ColumnText(19);
  return r;
}

absl::Status LoadTags(Connection& conn, RunRow& row) {
  CL_ASSIGN_OR_RETURN(Statement st, conn.Prepare("SELECT tag FROM run_tags WHERE run_id = ? ORDER BY tag"));
  st.Bind(1, row.id);
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    row.tags.push_back(st.ColumnText(0));
  }
  return absl::OkStatus();
}

// Counts the rows of a series in a step range, then reads them keeping evenly
// spaced ranks (always the first and the last). Both statements take the
// same leading `keys` and then (min_step, max_step); rows are (step, value).
absl::Status ReadDownsampled(Connection& c, const std::string& count_sql, const std::string& rows_sql,
                             const std::vector<int64_t>& keys, int64_t min_step, int64_t max_step, int64_t max_points,
                             std::vector<int64_t>& steps, std::vector<double>& values, int64_t& total) {
  auto bind = [&](Statement& st) {
    int i = 1;
    for (int64_t k : keys) st.Bind(i++, k);
    st.Bind(i, min_step);
    st.Bind(i + 1, max_step);
  };
  {
    CL_ASSIGN_OR_RETURN(Statement st, c.Prepare(count_sql));
    bind(st);
    CL_ASSIGN_OR_RETURN(bool row, st.Step());
    total = row ? st.ColumnInt(0) : 0;
  }
  max_points = std::max<int64_t>(2, max_points);
  const int64_t stride = total <= max_points ? 1 : (total - 2) / (max_points - 1) + 1;
  CL_ASSIGN_OR_RETURN(Statement st, c.Prepare(rows_sql));
  bind(st);
  int64_t rank = 0;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    if (rank % stride == 0 || rank == total - 1) {
      steps.push_back(st.ColumnInt(0));
      values.push_back(st.ColumnDouble(1));
    }
    ++rank;
  }
  return absl::OkStatus();
}

CoordinateDefRow ReadCoordinateDef(Statement& st, int first) {
  CoordinateDefRow d;
  d.id = st.ColumnInt(first);
  d.index = static_cast<int32_t>(st.ColumnInt(first + 1));
  d.label = st.ColumnText(first + 2);
  d.canonical = st.ColumnText(first + 3);
  d.matrix = st.ColumnText(first + 4);
  d.layer = static_cast<int>(st.ColumnInt(first + 5));
  d.head = static_cast<int>(st.ColumnInt(first + 6));
  d.block_q = st.ColumnText(first + 7);
  d.block_k = st.ColumnText(first + 8);
  d.element = st.ColumnText(first + 9);
  d.norm = st.ColumnDouble(first + 10);
  d.gauge = st.ColumnInt(first + 11) != 0;
  return d;
}

}  // namespace circuitlab::store
