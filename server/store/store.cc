#include "server/store/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/clock.h"
#include "server/common/status_macros.h"
#include "server/store/migrations.h"
#include "server/store/sqlite.h"

namespace circuitlab::store {
namespace fs = std::filesystem;

namespace {

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
  return r;
}

constexpr const char* kRunColumns =
    "id, name, spec, state, priority, device_request, created_at, started_at, finished_at, device, error, "
    "step, total_steps, attempts, checkpoint_step, owner, ifnull(sweep_id, 0), sweep_values, warning";

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
                             const std::vector<int64_t>& keys, int64_t min_step, int64_t max_step,
                             int64_t max_points, std::vector<int64_t>& steps, std::vector<double>& values,
                             int64_t& total) {
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

constexpr const char* kCoordinateDefColumns =
    "coord_id, coord_index, label, canonical, matrix, layer, head, block_q, block_k, element, norm, gauge";

CoordinateDefRow ReadCoordinateDef(Statement& st, int first = 0) {
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

}  // namespace

// ---------------------------------------------------------------------------

class Store::Impl {
 public:
  using WriteFn = std::function<absl::Status(Connection&)>;

  Impl(std::string dir, StoreOptions options, int lock_fd, std::unique_ptr<Connection> writer)
      : dir_(std::move(dir)), options_(options), lock_fd_(lock_fd), writer_conn_(std::move(writer)) {
    writer_thread_ = std::thread([this] { WriterLoop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    writer_thread_.join();
    readers_.clear();
    writer_conn_.reset();
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  const std::string& dir() const { return dir_; }
  std::string db_path() const { return dir_ + "/circuitlab.db"; }

  // Queue a write; returns a future for its (post-commit) status. `metrics`
  // (with its run) marks a metrics append later appends may join.
  std::future<absl::Status> Submit(WriteFn fn, bool sync, std::shared_ptr<std::vector<MetricPoint>> metrics = nullptr,
                                   int64_t metrics_run = 0) {
    Op op{std::move(fn), sync, std::promise<absl::Status>(), std::move(metrics), metrics_run};
    std::future<absl::Status> f = op.done.get_future();
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) {
        op.done.set_value(absl::UnavailableError("store is closing"));
        return f;
      }
      if (!sync) {
        space_cv_.wait(lock, [&] { return stopping_ || pending_async_ < options_.max_pending_ops; });
        ++pending_async_;
        if (!first_async_) first_async_ = std::chrono::steady_clock::now();
      } else {
        ++pending_sync_;
      }
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
    return f;
  }

  absl::Status Write(WriteFn fn) { return Submit(std::move(fn), /*sync=*/true).get(); }

  // Appends `points` to the metrics append of the same run queued last, if
  // that is the newest queued write: one op (one savepoint) for many steps
  // when metrics arrive faster than the writer commits (a remote worker's
  // batches). False when there is none to join.
  bool JoinMetrics(int64_t run_id, std::vector<MetricPoint>& points) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || queue_.empty()) return false;
    Op& last = queue_.back();
    if (!last.metrics || last.metrics_run != run_id || last.metrics->size() + points.size() > 8192) return false;
    last.metrics->insert(last.metrics->end(), std::make_move_iterator(points.begin()),
                         std::make_move_iterator(points.end()));
    return true;
  }

  // A read-only connection, returned to the pool when the handle dies.
  struct ReaderDeleter {
    Impl* impl;
    void operator()(Connection* c) const { impl->Release(c); }
  };
  using Reader = std::unique_ptr<Connection, ReaderDeleter>;

  absl::StatusOr<Reader> AcquireReader() {
    {
      std::lock_guard<std::mutex> lock(readers_mu_);
      if (!free_readers_.empty()) {
        Connection* c = free_readers_.back();
        free_readers_.pop_back();
        return Reader(c, ReaderDeleter{this});
      }
    }
    CL_ASSIGN_OR_RETURN(std::unique_ptr<Connection> conn, Connection::Open(db_path(), /*read_write=*/false));
    Connection* raw = conn.get();
    std::lock_guard<std::mutex> lock(readers_mu_);
    readers_.push_back(std::move(conn));
    return Reader(raw, ReaderDeleter{this});
  }

  void Release(Connection* c) {
    std::lock_guard<std::mutex> lock(readers_mu_);
    if (static_cast<int>(free_readers_.size()) < options_.reader_connections) {
      free_readers_.push_back(c);
      return;
    }
    readers_.erase(std::remove_if(readers_.begin(), readers_.end(), [&](auto& p) { return p.get() == c; }),
                   readers_.end());
  }

  // Rows the op in progress wrote (writer thread only; counted once committed).
  void CountOpRows(uint64_t metric_points, uint64_t coordinate_values) {
    op_rows_[0] += metric_points;
    op_rows_[1] += coordinate_values;
  }

  Store::WriteStats Stats() const {
    Store::WriteStats w;
    w.commits = commits_.load();
    for (const auto& b : commit_buckets_) w.commit_buckets.push_back(b.load());
    w.commit_seconds = static_cast<double>(commit_micros_.load()) / 1e6;
    w.metric_points = rows_[0].load();
    w.coordinate_values = rows_[1].load();
    return w;
  }

  // Metric-name ids, cached; only the writer thread calls this.
  absl::StatusOr<int64_t> NameId(Connection& conn, const std::string& name) {
    for (auto* cache : {&name_ids_, &name_ids_batch_, &name_ids_op_}) {
      auto it = cache->find(name);
      if (it != cache->end()) return it->second;
    }
    {
      CL_ASSIGN_OR_RETURN(Statement ins, conn.Prepare("INSERT OR IGNORE INTO metric_names(name) VALUES (?)"));
      ins.Bind(1, name);
      CL_RETURN_IF_ERROR(ins.Run());
    }
    CL_ASSIGN_OR_RETURN(Statement sel, conn.Prepare("SELECT id FROM metric_names WHERE name = ?"));
    sel.Bind(1, name);
    CL_ASSIGN_OR_RETURN(bool row, sel.Step());
    if (!row) return absl::InternalError("metric name vanished: " + name);
    int64_t id = sel.ColumnInt(0);
    name_ids_op_.emplace(name, id);
    return id;
  }

 private:
  struct Op {
    WriteFn fn;
    bool sync;
    std::promise<absl::Status> done;
    std::shared_ptr<std::vector<MetricPoint>> metrics;  // a metrics append (JoinMetrics)
    int64_t metrics_run = 0;
  };

  void WriterLoop() {
    while (true) {
      std::deque<Op> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        while (true) {
          if (queue_.empty()) {
            if (stopping_) {
              writer_done_ = true;
              return;
            }
            cv_.wait(lock);
            continue;
          }
          if (stopping_ || pending_sync_ > 0 || pending_async_ >= options_.max_batch_ops) break;
          auto deadline = first_async_.value_or(std::chrono::steady_clock::now()) + options_.flush_interval;
          if (std::chrono::steady_clock::now() >= deadline) break;
          cv_.wait_until(lock, deadline);
        }
        batch.swap(queue_);
        pending_async_ = 0;
        pending_sync_ = 0;
        first_async_.reset();
      }
      space_cv_.notify_all();
      Commit(batch);
    }
  }

  // One transaction per batch; a savepoint per op so one failing op does not
  // take the others down.
  void Commit(std::deque<Op>& batch) {
    const auto started = std::chrono::steady_clock::now();
    uint64_t batch_rows[2] = {0, 0};
    std::vector<absl::Status> results(batch.size());
    Transaction tx(writer_conn_.get());
    absl::Status s = tx.Begin();
    if (s.ok()) {
      for (size_t i = 0; i < batch.size(); ++i) {
        absl::Status sp = writer_conn_->Exec("SAVEPOINT op");
        if (!sp.ok()) {
          results[i] = sp;
          continue;
        }
        op_rows_[0] = op_rows_[1] = 0;
        results[i] = batch[i].fn(*writer_conn_);
        if (results[i].ok()) {
          writer_conn_->Exec("RELEASE op").IgnoreError();
          name_ids_batch_.merge(name_ids_op_);
          batch_rows[0] += op_rows_[0];
          batch_rows[1] += op_rows_[1];
        } else {
          writer_conn_->Exec("ROLLBACK TO op").IgnoreError();
          writer_conn_->Exec("RELEASE op").IgnoreError();
        }
        name_ids_op_.clear();
      }
      s = tx.Commit();
    }
    if (s.ok()) {
      name_ids_.merge(name_ids_batch_);
      rows_[0] += batch_rows[0];
      rows_[1] += batch_rows[1];
    }
    name_ids_batch_.clear();
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count();
    size_t bucket = 0;
    while (bucket < std::size(Store::kCommitBuckets) && micros > Store::kCommitBuckets[bucket] * 1e6) ++bucket;
    ++commit_buckets_[bucket];
    commit_micros_ += static_cast<uint64_t>(micros);
    ++commits_;
    for (size_t i = 0; i < batch.size(); ++i) batch[i].done.set_value(s.ok() ? results[i] : s);
  }

  const std::string dir_;
  const StoreOptions options_;
  const int lock_fd_;
  std::unique_ptr<Connection> writer_conn_;
  // Metric-name ids (writer thread only): committed, committed-in-this-batch,
  // and written by the op in progress (dropped if it rolls back).
  std::map<std::string, int64_t> name_ids_;
  std::map<std::string, int64_t> name_ids_batch_;
  std::map<std::string, int64_t> name_ids_op_;
  uint64_t op_rows_[2] = {0, 0};  // (metric points, coordinate values) of the op in progress
  // Written by the writer thread, read by GetWriteStats.
  std::atomic<uint64_t> rows_[2] = {0, 0};
  std::atomic<uint64_t> commits_{0}, commit_micros_{0};
  std::array<std::atomic<uint64_t>, std::size(Store::kCommitBuckets) + 1> commit_buckets_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable space_cv_;
  std::deque<Op> queue_;
  size_t pending_async_ = 0;
  size_t pending_sync_ = 0;
  std::optional<std::chrono::steady_clock::time_point> first_async_;
  bool stopping_ = false;
  bool writer_done_ = false;
  std::thread writer_thread_;

  std::mutex readers_mu_;
  std::vector<std::unique_ptr<Connection>> readers_;
  std::vector<Connection*> free_readers_;
};

// ---------------------------------------------------------------------------

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
    CL_ASSIGN_OR_RETURN(Statement st, conn.Prepare("SELECT ifnull(max(seq), 0) FROM sqlite_sequence WHERE name = 'runs'"));
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

namespace {

absl::StatusOr<int64_t> InsertRunRow(Connection& c, const NewRun& run) {
  CL_ASSIGN_OR_RETURN(Statement st,
                      c.Prepare("INSERT INTO runs(name, spec, spec_json, state, priority, device_request, "
                                "created_at, total_steps, owner, sweep_id, sweep_values) "
                                "VALUES (?,?,?,?,?,?,?,?,?,?,?)"));
  st.Bind(1, run.name)
      .BindBlob(2, run.spec)
      .Bind(3, run.spec_json)
      .Bind(4, int64_t{run.state})
      .Bind(5, int64_t{run.priority})
      .Bind(6, int64_t{run.device_request})
      .Bind(7, run.created_at_us)
      .Bind(8, run.total_steps)
      .Bind(9, run.owner);
  if (run.sweep_id > 0) {
    st.Bind(10, run.sweep_id);
  } else {
    st.BindNull(10);
  }
  st.Bind(11, run.sweep_values);
  CL_RETURN_IF_ERROR(st.Run());
  const int64_t id = c.LastInsertRowId();
  for (const std::string& tag : run.tags) {
    CL_ASSIGN_OR_RETURN(Statement t, c.Prepare("INSERT OR IGNORE INTO run_tags(tag, run_id) VALUES (?, ?)"));
    t.Bind(1, tag).Bind(2, id);
    CL_RETURN_IF_ERROR(t.Run());
  }
  return id;
}

}  // namespace

absl::StatusOr<int64_t> Store::InsertRun(const NewRun& run) {
  int64_t id = 0;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(id, InsertRunRow(c, run));
    return absl::OkStatus();
  }));
  return id;
}

absl::StatusOr<std::pair<int64_t, std::vector<int64_t>>> Store::InsertSweep(const NewSweep& sweep,
                                                                              std::vector<NewRun> runs) {
  std::pair<int64_t, std::vector<int64_t>> ids;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    ids.second.clear();
    CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT INTO sweeps(name, spec, spec_json, created_at, owner) "
                                                "VALUES (?,?,?,?,?)"));
    st.Bind(1, sweep.name).BindBlob(2, sweep.spec).Bind(3, sweep.spec_json).Bind(4, sweep.created_at_us);
    st.Bind(5, sweep.owner);
    CL_RETURN_IF_ERROR(st.Run());
    ids.first = c.LastInsertRowId();
    for (NewRun& run : runs) {
      run.sweep_id = ids.first;
      CL_ASSIGN_OR_RETURN(int64_t id, InsertRunRow(c, run));
      ids.second.push_back(id);
    }
    return absl::OkStatus();
  }));
  return ids;
}

absl::StatusOr<int64_t> Store::InsertReproduction(const ReproductionRow& row) {
  int64_t id = 0;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(
        Statement st, c.Prepare("INSERT INTO reproductions(owner, state, created_at, body, summary) VALUES (?,?,?,?,?)"));
    st.Bind(1, row.owner).Bind(2, static_cast<int64_t>(row.state)).Bind(3, row.created_at_us).BindBlob(4, row.body);
    st.BindBlob(5, row.summary);
    CL_RETURN_IF_ERROR(st.Run());
    id = c.LastInsertRowId();
    return absl::OkStatus();
  }));
  return id;
}

absl::Status Store::UpdateReproduction(int64_t id, int state, const std::string& body, const std::string& summary) {
  return impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(Statement st,
                        c.Prepare("UPDATE reproductions SET state = ?, body = ?, summary = ? WHERE id = ?"));
    st.Bind(1, static_cast<int64_t>(state)).BindBlob(2, body).BindBlob(3, summary).Bind(4, id);
    CL_RETURN_IF_ERROR(st.Run());
    if (c.Changes() == 0) return absl::NotFoundError("reproduction p" + std::to_string(id) + " not found");
    return absl::OkStatus();
  });
}

absl::StatusOr<ReproductionRow> Store::GetReproduction(int64_t id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT id, owner, state, created_at, body, COALESCE(summary, '') "
                                               "FROM reproductions WHERE id = ?"));
  st.Bind(1, id);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return absl::NotFoundError("reproduction p" + std::to_string(id) + " not found");
  return ReproductionRow{st.ColumnInt(0), st.ColumnText(1), static_cast<int>(st.ColumnInt(2)), st.ColumnInt(3),
                         st.ColumnBlob(4), st.ColumnBlob(5)};
}

absl::StatusOr<ReproductionPage> Store::ListReproductions(const ReproductionQuery& q) {
  // A row stored before the summary column lists its body as its summary.
  std::string sql = std::string("SELECT id, owner, state, created_at, ") + (q.with_body ? "body" : "''") +
                    ", CASE WHEN length(summary) > 0 THEN summary ELSE body END FROM reproductions WHERE (? = '' OR owner = ?) AND (? = 0 OR id < ?)";
  if (!q.states.empty()) {
    sql += " AND state IN (";
    for (size_t i = 0; i < q.states.size(); ++i) sql += (i ? ",?" : "?");
    sql += ")";
  }
  sql += " ORDER BY id DESC LIMIT ?";
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(sql));
  st.Bind(1, q.owner).Bind(2, q.owner).Bind(3, q.before_id).Bind(4, q.before_id);
  int k = 5;
  for (int s : q.states) st.Bind(k++, static_cast<int64_t>(s));
  st.Bind(k, static_cast<int64_t>(q.limit));
  ReproductionPage page;
  int64_t bytes = 0;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    ReproductionRow row{st.ColumnInt(0), st.ColumnText(1), static_cast<int>(st.ColumnInt(2)),
                        st.ColumnInt(3),  st.ColumnBlob(4), st.ColumnBlob(5)};
    bytes += static_cast<int64_t>(row.body.size() + row.summary.size());
    if (q.max_bytes > 0 && bytes > q.max_bytes && !page.rows.empty()) {
      page.cut = true;
      break;
    }
    page.rows.push_back(std::move(row));
  }
  return page;
}

absl::StatusOr<SweepRow> Store::GetSweep(int64_t sweep_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT id, name, spec, created_at, owner FROM sweeps WHERE id = ?"));
  st.Bind(1, sweep_id);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return absl::NotFoundError("sweep s" + std::to_string(sweep_id) + " not found");
  SweepRow row;
  row.id = st.ColumnInt(0);
  row.name = st.ColumnText(1);
  row.spec = st.ColumnBlob(2);
  row.created_at_us = st.ColumnInt(3);
  row.owner = st.ColumnText(4);
  return row;
}

absl::StatusOr<std::vector<RunRow>> Store::SweepRuns(int64_t sweep_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare(std::string("SELECT ") + kRunColumns + " FROM runs WHERE sweep_id = ? ORDER BY id"));
  st.Bind(1, sweep_id);
  std::vector<RunRow> rows;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    rows.push_back(ReadRunRow(st));
  }
  return rows;
}

absl::Status Store::TransitionRun(int64_t run_id, const RunTransition& t) {
  return impl_->Write([&](Connection& c) -> absl::Status {
    int current = 0;
    {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("SELECT state FROM runs WHERE id = ?"));
      st.Bind(1, run_id);
      CL_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) return absl::NotFoundError("run r" + std::to_string(run_id) + " not found");
      current = static_cast<int>(st.ColumnInt(0));
    }
    if (!t.from_states.empty() &&
        std::find(t.from_states.begin(), t.from_states.end(), current) == t.from_states.end()) {
      return absl::FailedPreconditionError("run r" + std::to_string(run_id) + " is in state " +
                                           std::to_string(current));
    }
    CL_ASSIGN_OR_RETURN(
        Statement st,
        c.Prepare("UPDATE runs SET state = ?1, device = COALESCE(?2, device), error = COALESCE(?3, error), "
                  "started_at = CASE WHEN ?4 IS NOT NULL AND started_at = 0 THEN ?4 ELSE started_at END, "
                  "finished_at = COALESCE(?5, finished_at), attempts = attempts + ?6 WHERE id = ?7"));
    st.Bind(1, int64_t{t.state});
    t.device ? st.Bind(2, *t.device) : st.BindNull(2);
    t.error ? st.Bind(3, *t.error) : st.BindNull(3);
    t.started_at_us ? st.Bind(4, *t.started_at_us) : st.BindNull(4);
    t.finished_at_us ? st.Bind(5, *t.finished_at_us) : st.BindNull(5);
    st.Bind(6, int64_t{t.increment_attempts ? 1 : 0}).Bind(7, run_id);
    return st.Run();
  });
}

void Store::RecordProgress(int64_t run_id, int64_t step) {
  impl_->Submit(
      [run_id, step](Connection& c) -> absl::Status {
        CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("UPDATE runs SET step = ? WHERE id = ?"));
        st.Bind(1, step).Bind(2, run_id);
        return st.Run();
      },
      /*sync=*/false);
}

void Store::AppendMetrics(int64_t run_id, std::vector<MetricPoint> points) {
  if (points.empty() || impl_->JoinMetrics(run_id, points)) return;
  Impl* impl = impl_.get();
  auto shared = std::make_shared<std::vector<MetricPoint>>(std::move(points));
  impl_->Submit(
      [impl, run_id, shared](Connection& c) -> absl::Status {
        // Read under the writer's ownership: once this op is taken off the
        // queue nothing joins it any more.
        for (const MetricPoint& p : *shared) {
          CL_ASSIGN_OR_RETURN(int64_t name_id, impl->NameId(c, p.name));
          CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO metrics(run_id, name_id, step, value) "
                                                      "VALUES (?, ?, ?, ?)"));
          st.Bind(1, run_id).Bind(2, name_id).Bind(3, p.step).Bind(4, p.value);
          CL_RETURN_IF_ERROR(st.Run());
        }
        impl->CountOpRows(shared->size(), 0);
        return absl::OkStatus();
      },
      /*sync=*/false, shared, run_id);
}

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

absl::Status Store::Flush() {
  return impl_->Write([](Connection&) { return absl::OkStatus(); });
}

absl::StatusOr<RunRow> Store::GetRun(int64_t run_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  RunRow row;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(std::string("SELECT ") + kRunColumns + " FROM runs WHERE id = ?"));
    st.Bind(1, run_id);
    CL_ASSIGN_OR_RETURN(bool found, st.Step());
    if (!found) return absl::NotFoundError("run r" + std::to_string(run_id) + " not found");
    row = ReadRunRow(st);
  }
  CL_RETURN_IF_ERROR(LoadTags(*r, row));
  return row;
}

absl::StatusOr<RunPage> Store::ListRuns(const RunFilter& filter) {
  // Built from fixed fragments and bound parameters only (the state list
  // holds validated integers), so few distinct statements are ever cached.
  std::string where = " WHERE 1=1";
  std::vector<std::string> text_params;
  if (!filter.states.empty()) {
    where += " AND state IN (";
    where += absl::StrJoin(filter.states, ",") + ")";
  }
  if (filter.sweep_id > 0) where += " AND sweep_id = " + std::to_string(filter.sweep_id);
  if (filter.owner.has_value()) {
    where += " AND owner = ?";
    text_params.push_back(*filter.owner);
  }
  for (size_t i = 0; i < filter.tags.size(); ++i) {
    where += " AND id IN (SELECT run_id FROM run_tags WHERE tag = ?)";
    text_params.push_back(filter.tags[i]);
  }
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  RunPage page;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT count(*) FROM runs" + where));
    for (size_t i = 0; i < text_params.size(); ++i) st.Bind(static_cast<int>(i + 1), text_params[i]);
    CL_ASSIGN_OR_RETURN(bool row, st.Step());
    page.total = row ? st.ColumnInt(0) : 0;
  }
  // The page position and size are bound, so the cached statement is the
  // same for every page of a filter.
  const std::string sql = std::string("SELECT ") + kRunColumns + " FROM runs" + where +
                          " AND id < ? ORDER BY id DESC LIMIT ?";
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(sql));
    const int n = static_cast<int>(text_params.size());
    for (int i = 0; i < n; ++i) st.Bind(i + 1, text_params[i]);
    st.Bind(n + 1, filter.before_id > 0 ? filter.before_id : std::numeric_limits<int64_t>::max());
    st.Bind(n + 2, int64_t{std::max(1, filter.limit)});
    int64_t bytes = 0;
    while (true) {
      CL_ASSIGN_OR_RETURN(bool more, st.Step());
      if (!more) break;
      page.runs.push_back(ReadRunRow(st));
      const RunRow& row = page.runs.back();
      bytes += static_cast<int64_t>(row.spec.size() + row.name.size() + row.error.size() + row.warning.size());
      if (filter.max_bytes > 0 && bytes >= filter.max_bytes) {
        page.cut = true;
        break;
      }
    }
  }
  for (RunRow& row : page.runs) CL_RETURN_IF_ERROR(LoadTags(*r, row));
  return page;
}

absl::StatusOr<std::vector<int64_t>> Store::RunIdsInState(int state) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT id FROM runs WHERE state = ? ORDER BY priority DESC, id"));
  st.Bind(1, int64_t{state});
  std::vector<int64_t> ids;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    ids.push_back(st.ColumnInt(0));
  }
  return ids;
}

absl::StatusOr<std::vector<MetricSeries>> Store::GetMetrics(int64_t run_id, const MetricQuery& q) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  // Which series.
  std::vector<std::pair<int64_t, std::string>> names;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT DISTINCT n.id, n.name FROM metric_names n WHERE EXISTS "
                                                 "(SELECT 1 FROM metrics m WHERE m.run_id = ? AND m.name_id = n.id) "
                                                 "ORDER BY n.name"));
    st.Bind(1, run_id);
    while (true) {
      CL_ASSIGN_OR_RETURN(bool more, st.Step());
      if (!more) break;
      std::string name = st.ColumnText(1);
      if (q.names.empty() || std::find(q.names.begin(), q.names.end(), name) != q.names.end()) {
        names.emplace_back(st.ColumnInt(0), std::move(name));
      }
    }
  }
  const int64_t max_step = q.max_step > 0 ? q.max_step : std::numeric_limits<int64_t>::max();
  const int64_t per_series_cap =
      std::min<int64_t>(q.max_points, q.max_total_points / std::max<int64_t>(1, static_cast<int64_t>(names.size())));
  std::vector<MetricSeries> out;
  for (auto& [id, name] : names) {
    MetricSeries s;
    s.name = name;
    CL_RETURN_IF_ERROR(ReadDownsampled(
        *r, "SELECT count(*) FROM metrics WHERE run_id = ? AND name_id = ? AND step BETWEEN ? AND ?",
        "SELECT step, value FROM metrics WHERE run_id = ? AND name_id = ? AND step BETWEEN ? AND ? ORDER BY step",
        {run_id, id}, q.min_step, max_step, per_series_cap, s.steps, s.values, s.total_points));
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::map<std::string, double>> Store::LatestMetrics(int64_t run_id) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  // A loose index scan: hop from one series to the next through the primary
  // key (run_id, name_id, step), then read each series' last row; a few index
  // seeks per series instead of a scan of every point of the run.
  CL_ASSIGN_OR_RETURN(
      Statement st, r->Prepare("WITH RECURSIVE series(id) AS ("
                               " SELECT (SELECT min(name_id) FROM metrics WHERE run_id = ?1)"
                               " UNION ALL SELECT (SELECT min(name_id) FROM metrics WHERE run_id = ?1 AND name_id > id)"
                               " FROM series WHERE id IS NOT NULL) "
                               "SELECT n.name, (SELECT value FROM metrics WHERE run_id = ?1 AND name_id = series.id "
                               "ORDER BY step DESC LIMIT 1) FROM series JOIN metric_names n ON n.id = series.id"));
  st.Bind(1, run_id);
  std::map<std::string, double> out;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    out[st.ColumnText(0)] = st.ColumnDouble(1);
  }
  return out;
}

absl::StatusOr<std::optional<Checkpoint>> Store::LatestCheckpoint(int64_t run_id) {
  return CheckpointAt(run_id, -1);
}

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
                               std::to_string(bytes.size()) +
                               " of " + std::to_string(size) + " bytes)");
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

absl::StatusOr<int64_t> Store::DeleteRuns(const std::vector<int64_t>& run_ids, const std::vector<int>& ended,
                                          int64_t sweep_id) {
  int64_t freed = 0;
  std::vector<std::string> files;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    freed = 0;
    files.clear();
    for (int64_t id : run_ids) {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("SELECT state FROM runs WHERE id = ?"));
      st.Bind(1, id);
      CL_ASSIGN_OR_RETURN(bool found, st.Step());
      if (!found) return absl::NotFoundError("run r" + std::to_string(id) + " not found");
      const int state = static_cast<int>(st.ColumnInt(0));
      if (std::find(ended.begin(), ended.end(), state) == ended.end()) {
        return absl::FailedPreconditionError("run r" + std::to_string(id) + " has not ended; cancel it first "
                                             "(circuitlab cancel r" + std::to_string(id) + ")");
      }
      CL_ASSIGN_OR_RETURN(Statement paths, c.Prepare("SELECT path, size_bytes FROM checkpoints WHERE run_id = ?"));
      paths.Bind(1, id);
      while (true) {
        CL_ASSIGN_OR_RETURN(bool more, paths.Step());
        if (!more) break;
        files.push_back(paths.ColumnText(0));
        freed += paths.ColumnInt(1);
      }
      // Metrics, tags, checkpoints, coordinate definitions (and with them
      // their values) and analyses go with the row (ON DELETE CASCADE).
      CL_ASSIGN_OR_RETURN(Statement del, c.Prepare("DELETE FROM runs WHERE id = ?"));
      del.Bind(1, id);
      CL_RETURN_IF_ERROR(del.Run());
    }
    if (sweep_id > 0) {
      CL_ASSIGN_OR_RETURN(Statement del, c.Prepare("DELETE FROM sweeps WHERE id = ?"));
      del.Bind(1, sweep_id);
      CL_RETURN_IF_ERROR(del.Run());
    }
    return absl::OkStatus();
  }));
  // Files go only after the rows that pointed at them are gone.
  std::error_code ec;
  for (const std::string& p : files) fs::remove(CheckpointFile(impl_->dir(), p), ec);
  for (int64_t id : run_ids) fs::remove_all(impl_->dir() + "/checkpoints/r" + std::to_string(id), ec);
  // Returns freed pages to the file system when the database was created
  // with incremental auto-vacuum (new ones are); a no-op otherwise.
  CL_RETURN_IF_ERROR(impl_->Write([](Connection& c) { return c.Exec("PRAGMA incremental_vacuum"); }));
  return freed;
}

absl::Status Store::SetRunWarning(int64_t run_id, const std::string& warning) {
  return impl_->Write([&](Connection& c) -> absl::Status {
    CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("UPDATE runs SET warning = ? WHERE id = ?"));
    st.Bind(1, warning).Bind(2, run_id);
    return st.Run();
  });
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

absl::StatusOr<std::vector<int64_t>> Store::PutCoordinateDefs(int64_t run_id, const std::string& selection,
                                                              const std::vector<CoordinateDefRow>& defs) {
  std::vector<int64_t> ids;
  CL_RETURN_IF_ERROR(impl_->Write([&](Connection& c) -> absl::Status {
    ids.clear();
    {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("SELECT coord_id FROM coordinate_defs WHERE run_id = ? AND "
                                                  "selection = ? ORDER BY coord_index"));
      st.Bind(1, run_id).Bind(2, selection);
      while (true) {
        CL_ASSIGN_OR_RETURN(bool more, st.Step());
        if (!more) break;
        ids.push_back(st.ColumnInt(0));
      }
    }
    if (!ids.empty()) {
      if (ids.size() != defs.size()) {
        return absl::FailedPreconditionError("run r" + std::to_string(run_id) + " already has " +
                                             std::to_string(ids.size()) + " " + selection + " coordinates, not " +
                                             std::to_string(defs.size()));
      }
      return absl::OkStatus();
    }
    for (const CoordinateDefRow& d : defs) {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT INTO coordinate_defs(run_id, selection, coord_index, label, "
                                                  "canonical, matrix, layer, head, block_q, block_k, element, norm, "
                                                  "gauge) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"));
      st.Bind(1, run_id).Bind(2, selection).Bind(3, int64_t{d.index}).Bind(4, d.label).Bind(5, d.canonical);
      st.Bind(6, d.matrix).Bind(7, int64_t{d.layer}).Bind(8, int64_t{d.head}).Bind(9, d.block_q).Bind(10, d.block_k);
      st.Bind(11, d.element).Bind(12, d.norm).Bind(13, int64_t{d.gauge ? 1 : 0});
      CL_RETURN_IF_ERROR(st.Run());
      ids.push_back(c.LastInsertRowId());
    }
    return absl::OkStatus();
  }));
  return ids;
}

void Store::AppendCoordinates(int64_t run_id, int64_t step, std::vector<int64_t> ids, std::vector<double> values) {
  if (ids.empty()) return;
  Impl* impl = impl_.get();
  impl_->Submit(
      [impl, run_id, step, ids = std::move(ids), values = std::move(values)](Connection& c) -> absl::Status {
        for (size_t i = 0; i < ids.size() && i < values.size(); ++i) {
          CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO coordinates(coord_id, step, run_id, "
                                                      "value) VALUES (?, ?, ?, ?)"));
          st.Bind(1, ids[i]).Bind(2, step).Bind(3, run_id).Bind(4, values[i]);
          CL_RETURN_IF_ERROR(st.Run());
        }
        impl->CountOpRows(0, std::min(ids.size(), values.size()));
        return absl::OkStatus();
      },
      /*sync=*/false);
}

Store::WriteStats Store::GetWriteStats() const { return impl_->Stats(); }

absl::StatusOr<std::map<int, int64_t>> Store::CountRunsByState() {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT state, COUNT(*) FROM runs GROUP BY state"));
  std::map<int, int64_t> counts;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    counts[static_cast<int>(st.ColumnInt(0))] = st.ColumnInt(1);
  }
  return counts;
}

absl::StatusOr<std::vector<CoordinateSeries>> Store::GetTrajectory(int64_t run_id, const TrajectoryQuery& q) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  std::vector<CoordinateDefRow> defs;
  {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare(std::string("SELECT ") + kCoordinateDefColumns +
                                                 " FROM coordinate_defs WHERE run_id = ? AND selection = ? "
                                                 "ORDER BY coord_index"));
    st.Bind(1, run_id).Bind(2, q.selection);
    while (true) {
      CL_ASSIGN_OR_RETURN(bool more, st.Step());
      if (!more) break;
      CoordinateDefRow d = ReadCoordinateDef(st);
      const bool wanted = q.names.empty() ||
                          std::find(q.names.begin(), q.names.end(), d.label) != q.names.end() ||
                          (!d.canonical.empty() && std::find(q.names.begin(), q.names.end(), d.canonical) !=
                                                       q.names.end());
      if (wanted) defs.push_back(std::move(d));
    }
  }
  const int64_t max_step = q.max_step > 0 ? q.max_step : std::numeric_limits<int64_t>::max();
  const int64_t cap =
      std::min<int64_t>(q.max_points, q.max_total_points / std::max<int64_t>(1, static_cast<int64_t>(defs.size())));
  std::vector<CoordinateSeries> out;
  for (CoordinateDefRow& d : defs) {
    CoordinateSeries s;
    CL_RETURN_IF_ERROR(ReadDownsampled(
        *r, "SELECT count(*) FROM coordinates WHERE coord_id = ? AND step BETWEEN ? AND ?",
        "SELECT step, value FROM coordinates WHERE coord_id = ? AND step BETWEEN ? AND ? ORDER BY step", {d.id},
        q.min_step, max_step, cap, s.steps, s.values, s.total_points));
    s.def = std::move(d);
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<CoordinateDefRow, double>>> Store::CoordinatesAt(int64_t run_id,
                                                                                        const std::string& selection,
                                                                                        int64_t step) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare(std::string("SELECT c.value, ") + kCoordinateDefColumns +
                                 " FROM coordinates c JOIN coordinate_defs USING (coord_id) WHERE c.run_id = ? AND "
                                 "c.step = ? AND selection = ? ORDER BY coord_index"));
  st.Bind(1, run_id).Bind(2, step).Bind(3, selection);
  std::vector<std::pair<CoordinateDefRow, double>> out;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    out.emplace_back(ReadCoordinateDef(st, 1), st.ColumnDouble(0));
  }
  return out;
}

absl::StatusOr<std::vector<Store::LastValue>> Store::LastCoordinateOfRuns(const std::vector<int64_t>& run_ids,
                                                                         const std::string& selection,
                                                                         const std::string& label) {
  const std::string ids = absl::StrCat("[", absl::StrJoin(run_ids, ","), "]");
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  // coordinate_defs_by_label finds each run's coordinate; the coordinates
  // primary key (coord_id, step) finds its last step.
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare("SELECT d.run_id, c.step, c.value FROM coordinate_defs d JOIN coordinates c ON "
                                 "c.coord_id = d.coord_id AND c.step = (SELECT max(step) FROM coordinates WHERE "
                                 "coord_id = d.coord_id) WHERE d.run_id IN (SELECT value FROM json_each(?1)) AND "
                                 "d.selection = ?2 AND (d.label = ?3 OR d.canonical = ?3) ORDER BY d.run_id"));
  st.Bind(1, ids).Bind(2, selection).Bind(3, label);
  std::vector<LastValue> out;
  while (true) {
    CL_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    out.push_back({st.ColumnInt(0), st.ColumnInt(1), st.ColumnDouble(2)});
  }
  return out;
}

absl::Status Store::PutAnalysis(int64_t run_id, const std::string& kind, int64_t request_hash,
                                const std::string& request, const std::string& result, const std::string& owner,
                                int64_t max_owner_bytes, int* evicted) {
  const int64_t now = Clock::Real()->NowMicros();
  if (evicted != nullptr) *evicted = 0;
  return impl_->Write([&](Connection& c) -> absl::Status {
    if (run_id == kNoRun) {
      CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO spec_analyses(kind, request_hash, request, "
                                                  "result, created_at) VALUES (?, ?, ?, ?, ?)"));
      st.Bind(1, kind).Bind(2, request_hash).BindBlob(3, request).BindBlob(4, result).Bind(5, now);
      return st.Run();
    }
    CL_ASSIGN_OR_RETURN(Statement st, c.Prepare("INSERT OR REPLACE INTO analyses(run_id, kind, request_hash, request, "
                                                "result, created_at, owner, bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"));
    st.Bind(1, run_id).Bind(2, kind).Bind(3, request_hash).BindBlob(4, request).BindBlob(5, result).Bind(6, now);
    st.Bind(7, owner).Bind(8, static_cast<int64_t>(request.size() + result.size()));
    CL_RETURN_IF_ERROR(st.Run());
    if (owner.empty() || max_owner_bytes <= 0) return absl::OkStatus();
    CL_ASSIGN_OR_RETURN(Statement sum, c.Prepare("SELECT COALESCE(SUM(bytes), 0) FROM analyses WHERE owner = ?"));
    sum.Bind(1, owner);
    CL_ASSIGN_OR_RETURN(bool got, sum.Step());
    int64_t over = (got ? sum.ColumnInt(0) : 0) - max_owner_bytes;
    if (over <= 0) return absl::OkStatus();
    // The owner's oldest answers go first, never the one just stored.
    struct Victim {
      int64_t run_id;
      std::string kind;
      int64_t hash;
    };
    std::vector<Victim> victims;
    CL_ASSIGN_OR_RETURN(Statement oldest, c.Prepare("SELECT run_id, kind, request_hash, bytes FROM analyses WHERE "
                                                    "owner = ? ORDER BY created_at, request_hash"));
    oldest.Bind(1, owner);
    while (over > 0) {
      CL_ASSIGN_OR_RETURN(bool row, oldest.Step());
      if (!row) break;
      Victim v{oldest.ColumnInt(0), oldest.ColumnText(1), oldest.ColumnInt(2)};
      if (v.run_id == run_id && v.kind == kind && v.hash == request_hash) continue;
      over -= oldest.ColumnInt(3);
      victims.push_back(std::move(v));
    }
    for (const Victim& v : victims) {
      CL_ASSIGN_OR_RETURN(Statement del,
                          c.Prepare("DELETE FROM analyses WHERE run_id = ? AND kind = ? AND request_hash = ?"));
      del.Bind(1, v.run_id).Bind(2, v.kind).Bind(3, v.hash);
      CL_RETURN_IF_ERROR(del.Run());
    }
    if (evicted != nullptr) *evicted = static_cast<int>(victims.size());
    return absl::OkStatus();
  });
}

absl::StatusOr<int64_t> Store::StoredAnalysisBytes(const std::string& owner) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT COALESCE(SUM(bytes), 0) FROM analyses WHERE owner = ?"));
  st.Bind(1, owner);
  CL_ASSIGN_OR_RETURN(bool got, st.Step());
  return got ? st.ColumnInt(0) : 0;
}

absl::StatusOr<std::optional<std::string>> Store::GetAnalysis(int64_t run_id, const std::string& kind,
                                                              int64_t request_hash) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  if (run_id == kNoRun) {
    CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT result FROM spec_analyses WHERE kind = ? AND request_hash = ?"));
    st.Bind(1, kind).Bind(2, request_hash);
    CL_ASSIGN_OR_RETURN(bool found, st.Step());
    if (!found) return std::optional<std::string>();
    return std::optional<std::string>(st.ColumnBlob(0));
  }
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT result FROM analyses WHERE run_id = ? AND kind = ? AND "
                                               "request_hash = ?"));
  st.Bind(1, run_id).Bind(2, kind).Bind(3, request_hash);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return std::optional<std::string>();
  return std::optional<std::string>(st.ColumnBlob(0));
}

absl::StatusOr<std::vector<Store::StoredAnalysis>> Store::ListAnalyses(int64_t run_id, const std::string& kind,
                                                                      int limit, std::optional<AnalysisCursor> after,
                                                                      int64_t max_bytes, bool* cut) {
  if (cut != nullptr) *cut = false;
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st,
                      r->Prepare("SELECT request, result, created_at, request_hash FROM analyses WHERE run_id = ? AND "
                                 "kind = ? AND (? = 0 OR created_at < ? OR (created_at = ? AND request_hash > ?)) "
                                 "ORDER BY created_at DESC, request_hash LIMIT ?"));
  const AnalysisCursor from = after.value_or(AnalysisCursor{});
  st.Bind(1, run_id).Bind(2, kind).Bind(3, static_cast<int64_t>(after.has_value())).Bind(4, from.created_at);
  st.Bind(5, from.created_at).Bind(6, from.request_hash).Bind(7, static_cast<int64_t>(limit));
  std::vector<StoredAnalysis> out;
  int64_t bytes = 0;
  for (;;) {
    CL_ASSIGN_OR_RETURN(bool found, st.Step());
    if (!found) break;
    StoredAnalysis row{st.ColumnBlob(0), st.ColumnBlob(1), st.ColumnInt(2), st.ColumnInt(3)};
    bytes += static_cast<int64_t>(row.request.size() + row.result.size());
    if (max_bytes > 0 && bytes > max_bytes && !out.empty()) {
      if (cut != nullptr) *cut = true;
      break;
    }
    out.push_back(std::move(row));
  }
  return out;
}

absl::StatusOr<std::optional<Store::StoredAnalysis>> Store::GetStoredAnalysis(int64_t run_id, const std::string& kind,
                                                                             int64_t request_hash) {
  CL_ASSIGN_OR_RETURN(Impl::Reader r, impl_->AcquireReader());
  CL_ASSIGN_OR_RETURN(Statement st, r->Prepare("SELECT request, result, created_at FROM analyses WHERE run_id = ? AND "
                                               "kind = ? AND request_hash = ?"));
  st.Bind(1, run_id).Bind(2, kind).Bind(3, request_hash);
  CL_ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return std::optional<StoredAnalysis>();
  return std::optional<StoredAnalysis>(StoredAnalysis{st.ColumnBlob(0), st.ColumnBlob(1), st.ColumnInt(2), request_hash});
}

}  // namespace circuitlab::store
