// Per-run publish/subscribe of RunEvents for WatchRun.
//
// Every event published for a run gets the next sequence number of that run
// and is kept in a bounded per-run buffer, so a watcher that reconnects with
// the last (epoch, sequence) it saw gets exactly the events it missed while
// they are still buffered. When they are not (buffer overrun, another server
// epoch, a subscriber too slow to keep up), the subscriber reports `resync`
// and the caller sends a fresh snapshot instead.
//
// Subscribers are polled (Next) and can arm a one-shot notification, which
// suits gRPC's callback reactors: never block in a reaction.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "circuitlab/v1/experiment_service.pb.h"

namespace circuitlab::scheduler {

class ProgressHub;

class Subscriber {
 public:
  enum class Kind { kEvent, kResync, kEnd, kNone };
  struct Item {
    Kind kind = Kind::kNone;
    v1::RunEvent event;     // for kEvent
    uint64_t sequence = 0;  // for kResync: the snapshot's sequence number
  };

  // The next item without blocking: an event, a resync request (send a
  // snapshot numbered `sequence`, then continue with the following events;
  // always first on a fresh subscription, and again if events were lost), the
  // end of the stream (the run reached a final state and everything before
  // was delivered), or none.
  Item Next();
  // Arms a one-shot notification: `fn` is called once, from a publishing
  // thread, when Next() has something. Returns false (and does not keep `fn`)
  // when Next() already has something: poll again.
  bool Arm(std::function<void()> fn);
  // The sequence number the subscription started after (for snapshots).
  uint64_t start_sequence() const { return start_sequence_; }
  // Ends the stream now, dropping what is queued (its caller's token was
  // revoked): Next() answers kEnd from here on. Returns the notification to
  // run (outside any lock), if armed.
  std::function<void()> Close();

 private:
  friend class ProgressHub;
  Subscriber(bool include_metrics, size_t capacity) : include_metrics_(include_metrics), capacity_(capacity) {}
  // Returns the notification to run (outside any lock), if armed.
  std::function<void()> Push(const v1::RunEvent& event, bool heartbeat);
  std::function<void()> End();

  const bool include_metrics_;
  const size_t capacity_;
  uint64_t start_sequence_ = 0;
  std::mutex mu_;
  std::deque<v1::RunEvent> queue_;
  std::optional<uint64_t> resync_sequence_;
  bool ended_ = false;
  std::function<void()> notify_;
};

class ProgressHub {
 public:
  // `epoch` names this server process in every event. Heartbeats go to every
  // subscriber every `heartbeat` (0 disables).
  ProgressHub(std::string epoch, size_t buffer_per_run = 1024,
              std::chrono::milliseconds heartbeat = std::chrono::seconds(5), size_t max_subscribers = 1024);
  ~ProgressHub();

  const std::string& epoch() const { return epoch_; }

  // Assigns the run's next sequence number and delivers the event.
  uint64_t Publish(int64_t run_id, v1::RunEvent event);
  // The run reached a final state: subscribers get what is queued, then End.
  // Later subscriptions to the run are told to resync and then end.
  void Close(int64_t run_id);

  // A subscription to `run_id`. With after_sequence > 0 and a matching epoch,
  // buffered events after it are replayed; otherwise the first item is
  // kResync. nullptr when `max_subscribers` subscriptions are open already.
  std::shared_ptr<Subscriber> Subscribe(int64_t run_id, uint64_t after_sequence, const std::string& epoch,
                                        bool include_metrics);
  void Unsubscribe(int64_t run_id, const std::shared_ptr<Subscriber>& sub);

 private:
  struct Channel {
    uint64_t next_sequence = 1;
    bool closed = false;
    std::deque<v1::RunEvent> buffer;
    std::set<std::shared_ptr<Subscriber>> subscribers;
  };
  void HeartbeatLoop();

  const std::string epoch_;
  const size_t buffer_per_run_;
  const std::chrono::milliseconds heartbeat_;
  const size_t max_subscribers_;
  size_t subscribers_ = 0;  // open subscriptions, over all runs
  std::mutex mu_;
  std::map<int64_t, Channel> channels_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread heartbeat_thread_;
};

}  // namespace circuitlab::scheduler
