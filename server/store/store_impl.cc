#include "server/store/store_impl.h"

#include <chrono>
#include <deque>
#include <mutex>

namespace circuitlab::store {

void Store::Impl::WriterLoop() {
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
void Store::Impl::Commit(std::deque<Op>& batch) {
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

}  // namespace circuitlab::store
