// Store::Impl, which every table file of the store uses: the one writer
// thread with its queue of writes (batched into one transaction, a savepoint
// per write), and the pool of read-only connections. Internal to server/store.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/common/status_macros.h"
#include "server/store/sqlite.h"
#include "server/store/store.h"

namespace circuitlab::store {

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

  void WriterLoop();

  // One transaction per batch; a savepoint per op so one failing op does not
  // take the others down.
  void Commit(std::deque<Op>& batch);

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

}  // namespace circuitlab::store
