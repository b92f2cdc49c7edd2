#include "server/scheduler/progress_hub.h"

#include <vector>

namespace circuitlab::scheduler {

// Subscriber queues hold more than a run's buffer so a reconnect replay fits.
constexpr size_t kSubscriberSlack = 64;

Subscriber::Item Subscriber::Next() {
  std::lock_guard<std::mutex> lock(mu_);
  if (resync_sequence_) {
    Item item{Kind::kResync, {}, *resync_sequence_};
    resync_sequence_.reset();
    return item;
  }
  if (!queue_.empty()) {
    Item item{Kind::kEvent, std::move(queue_.front())};
    queue_.pop_front();
    return item;
  }
  if (ended_) return {Kind::kEnd, {}};
  return {Kind::kNone, {}};
}

bool Subscriber::Arm(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!queue_.empty() || resync_sequence_ || ended_) return false;
  notify_ = std::move(fn);
  return true;
}

std::function<void()> Subscriber::Push(const v1::RunEvent& event, bool heartbeat) {
  if (event.has_metrics() && !include_metrics_) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return nullptr;
  if (heartbeat && !queue_.empty()) return nullptr;  // a busy stream needs no heartbeat
  if (queue_.size() >= capacity_) {
    // The watcher is too slow: drop what it has not read and send a snapshot
    // as new as this event instead.
    queue_.clear();
    resync_sequence_ = event.sequence();
  } else {
    queue_.push_back(event);
  }
  return std::exchange(notify_, nullptr);
}

std::function<void()> Subscriber::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
  resync_sequence_.reset();
  ended_ = true;
  return std::exchange(notify_, nullptr);
}

std::function<void()> Subscriber::End() {
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  return std::exchange(notify_, nullptr);
}

ProgressHub::ProgressHub(std::string epoch, size_t buffer_per_run, std::chrono::milliseconds heartbeat,
                         size_t max_subscribers)
    : epoch_(std::move(epoch)), buffer_per_run_(buffer_per_run), heartbeat_(heartbeat),
      max_subscribers_(max_subscribers) {
  if (heartbeat_.count() > 0) heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
}

ProgressHub::~ProgressHub() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

uint64_t ProgressHub::Publish(int64_t run_id, v1::RunEvent event) {
  std::vector<std::function<void()>> notify;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Channel& ch = channels_[run_id];
    seq = ch.next_sequence++;
    event.set_sequence(seq);
    event.set_epoch(epoch_);
    ch.buffer.push_back(event);
    if (ch.buffer.size() > buffer_per_run_) ch.buffer.pop_front();
    for (const auto& sub : ch.subscribers) {
      if (auto fn = sub->Push(event, /*heartbeat=*/false)) notify.push_back(std::move(fn));
    }
  }
  for (auto& fn : notify) fn();
  return seq;
}

void ProgressHub::Close(int64_t run_id) {
  std::vector<std::function<void()>> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(run_id);
    if (it == channels_.end()) return;
    for (const auto& sub : it->second.subscribers) {
      if (auto fn = sub->End()) notify.push_back(std::move(fn));
    }
    subscribers_ -= it->second.subscribers.size();
    channels_.erase(it);
  }
  for (auto& fn : notify) fn();
}

std::shared_ptr<Subscriber> ProgressHub::Subscribe(int64_t run_id, uint64_t after_sequence, const std::string& epoch,
                                                   bool include_metrics) {
  std::shared_ptr<Subscriber> sub(new Subscriber(include_metrics, buffer_per_run_ + kSubscriberSlack));
  std::lock_guard<std::mutex> lock(mu_);
  if (subscribers_ >= max_subscribers_) return nullptr;
  ++subscribers_;
  Channel& ch = channels_[run_id];
  sub->start_sequence_ = ch.next_sequence - 1;
  const bool can_replay = after_sequence > 0 && epoch == epoch_ && after_sequence <= sub->start_sequence_ &&
                          (ch.buffer.empty() ? after_sequence == sub->start_sequence_
                                             : after_sequence + 1 >= ch.buffer.front().sequence());
  if (can_replay) {
    for (const v1::RunEvent& ev : ch.buffer) {
      if (ev.sequence() > after_sequence) sub->Push(ev, /*heartbeat=*/false);
    }
  } else {
    sub->resync_sequence_ = sub->start_sequence_;  // first item: a snapshot
  }
  ch.subscribers.insert(sub);
  return sub;
}

void ProgressHub::Unsubscribe(int64_t run_id, const std::shared_ptr<Subscriber>& sub) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(run_id);
  if (it == channels_.end()) return;
  if (it->second.subscribers.erase(sub) > 0) --subscribers_;
  // Drop idle channels nobody publishes to (e.g. watchers of ended runs).
  if (it->second.subscribers.empty() && it->second.buffer.empty()) channels_.erase(it);
}

void ProgressHub::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    stop_cv_.wait_for(lock, heartbeat_, [this] { return stopping_; });
    if (stopping_) break;
    std::vector<std::function<void()>> notify;
    for (auto& [run_id, ch] : channels_) {
      v1::RunEvent hb;
      hb.set_sequence(ch.next_sequence - 1);
      hb.set_epoch(epoch_);
      hb.mutable_heartbeat();
      for (const auto& sub : ch.subscribers) {
        if (auto fn = sub->Push(hb, /*heartbeat=*/true)) notify.push_back(std::move(fn));
      }
    }
    lock.unlock();
    for (auto& fn : notify) fn();
    lock.lock();
  }
}

}  // namespace circuitlab::scheduler
