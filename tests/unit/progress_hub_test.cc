#include "server/scheduler/progress_hub.h"

#include <gtest/gtest.h>

#include <atomic>

namespace circuitlab::scheduler {
namespace {

using Kind = Subscriber::Kind;

v1::RunEvent ProgressEvent(uint64_t step) {
  v1::RunEvent ev;
  ev.mutable_progress()->set_step(step);
  return ev;
}

TEST(ProgressHubTest, FreshSubscriptionStartsWithASnapshotThenEventsInOrder) {
  ProgressHub hub("epoch-a", 16, std::chrono::milliseconds(0));
  hub.Publish(1, ProgressEvent(1));
  auto sub = hub.Subscribe(1, 0, "", false);
  EXPECT_EQ(sub->start_sequence(), 1u);
  hub.Publish(1, ProgressEvent(2));
  hub.Publish(1, ProgressEvent(3));
  auto first = sub->Next();
  EXPECT_EQ(first.kind, Kind::kResync);
  EXPECT_EQ(first.sequence, 1u);
  auto a = sub->Next();
  auto b = sub->Next();
  ASSERT_EQ(a.kind, Kind::kEvent);
  EXPECT_EQ(a.event.sequence(), 2u);
  EXPECT_EQ(a.event.epoch(), "epoch-a");
  EXPECT_EQ(b.event.progress().step(), 3u);
  EXPECT_EQ(sub->Next().kind, Kind::kNone);
}

TEST(ProgressHubTest, ReconnectReplaysExactlyTheMissedEvents) {
  ProgressHub hub("epoch-a", 16, std::chrono::milliseconds(0));
  for (int i = 1; i <= 5; ++i) hub.Publish(7, ProgressEvent(i));
  auto sub = hub.Subscribe(7, 3, "epoch-a", false);
  auto a = sub->Next();
  ASSERT_EQ(a.kind, Kind::kEvent);
  EXPECT_EQ(a.event.sequence(), 4u);
  EXPECT_EQ(sub->Next().event.sequence(), 5u);
  EXPECT_EQ(sub->Next().kind, Kind::kNone);
}

TEST(ProgressHubTest, OtherEpochOrOverrunBufferMeansResync) {
  ProgressHub hub("epoch-b", 4, std::chrono::milliseconds(0));
  for (int i = 1; i <= 10; ++i) hub.Publish(7, ProgressEvent(i));
  EXPECT_EQ(hub.Subscribe(7, 9, "epoch-a", false)->Next().kind, Kind::kResync);  // server restarted
  EXPECT_EQ(hub.Subscribe(7, 2, "epoch-b", false)->Next().kind, Kind::kResync);  // 3..6 no longer buffered
  EXPECT_EQ(hub.Subscribe(7, 6, "epoch-b", false)->Next().kind, Kind::kEvent);   // 7..10 are
}

TEST(ProgressHubTest, MetricsOnlyForSubscribersThatAskForThem) {
  ProgressHub hub("e", 16, std::chrono::milliseconds(0));
  auto with = hub.Subscribe(1, 0, "", true);
  auto without = hub.Subscribe(1, 0, "", false);
  v1::RunEvent m;
  m.mutable_metrics()->add_points()->set_name("train/loss");
  hub.Publish(1, m);
  with->Next();
  without->Next();
  EXPECT_EQ(with->Next().kind, Kind::kEvent);
  EXPECT_EQ(without->Next().kind, Kind::kNone);
}

TEST(ProgressHubTest, SlowSubscriberGetsResyncNotUnboundedMemory) {
  ProgressHub hub("e", 8, std::chrono::milliseconds(0));
  auto sub = hub.Subscribe(1, 0, "", false);
  sub->Next();  // initial snapshot
  uint64_t last = 0;
  for (int i = 1; i <= 1000; ++i) last = hub.Publish(1, ProgressEvent(i));
  auto item = sub->Next();
  EXPECT_EQ(item.kind, Kind::kResync);
  EXPECT_GT(item.sequence, 0u);
  // Whatever follows comes after the resync point, in order.
  uint64_t prev = item.sequence;
  for (auto next = sub->Next(); next.kind == Kind::kEvent; next = sub->Next()) {
    EXPECT_GT(next.event.sequence(), prev);
    prev = next.event.sequence();
  }
  EXPECT_EQ(prev, last);
}

TEST(ProgressHubTest, CloseEndsTheStreamAfterQueuedEvents) {
  ProgressHub hub("e", 16, std::chrono::milliseconds(0));
  auto sub = hub.Subscribe(1, 0, "", false);
  sub->Next();
  hub.Publish(1, ProgressEvent(1));
  hub.Close(1);
  EXPECT_EQ(sub->Next().kind, Kind::kEvent);
  EXPECT_EQ(sub->Next().kind, Kind::kEnd);
}

TEST(ProgressHubTest, ArmNotifiesOnceWhenSomethingArrives) {
  ProgressHub hub("e", 16, std::chrono::milliseconds(0));
  auto sub = hub.Subscribe(1, 0, "", false);
  EXPECT_FALSE(sub->Arm([] {}));  // the snapshot is already there
  sub->Next();
  std::atomic<int> calls{0};
  EXPECT_TRUE(sub->Arm([&] { calls++; }));
  hub.Publish(1, ProgressEvent(1));
  hub.Publish(1, ProgressEvent(2));
  EXPECT_EQ(calls.load(), 1);
}

TEST(ProgressHubTest, OpenSubscriptionsAreCapped) {
  ProgressHub hub("e", 16, std::chrono::milliseconds(0), /*max_subscribers=*/2);
  auto a = hub.Subscribe(1, 0, "", false);
  auto b = hub.Subscribe(2, 0, "", false);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(hub.Subscribe(3, 0, "", false), nullptr);
  hub.Unsubscribe(1, a);
  EXPECT_NE(hub.Subscribe(3, 0, "", false), nullptr);
  hub.Close(2);  // closing a run frees its subscriptions too
  EXPECT_NE(hub.Subscribe(4, 0, "", false), nullptr);
}

TEST(ProgressHubTest, HeartbeatsReachIdleSubscribers) {
  ProgressHub hub("e", 16, std::chrono::milliseconds(20));
  auto sub = hub.Subscribe(1, 0, "", false);
  sub->Next();
  std::atomic<bool> got{false};
  sub->Arm([&] { got = true; });
  for (int i = 0; i < 200 && !got; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(got);
  auto item = sub->Next();
  ASSERT_EQ(item.kind, Kind::kEvent);
  EXPECT_TRUE(item.event.has_heartbeat());
}

}  // namespace
}  // namespace circuitlab::scheduler
