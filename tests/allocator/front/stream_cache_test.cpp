// Stream caches (allocator/src/stream_cache.hpp): a free that finds the device lock held parks
// its block in its stream's cache, and an allocation of the same rounded size on that stream
// takes it back without the lock. The device lock is held here deterministically by a thread
// stopped inside a backend call (GatedBackend), so every test knows which path a call takes.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;
using namespace std::chrono_literals;

namespace {

// A SimBackend whose record_event() can be made to stop until released: the Allocator calls it
// with its device lock held, so while a thread is stopped there, the lock is taken.
class GatedBackend final : public ForwardingBackend {
 public:
  explicit GatedBackend(SimBackend& sim) : ForwardingBackend(sim) {}

  void arm() {
    std::lock_guard lock(mu_);
    armed_ = true;
  }
  void wait_until_stopped() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return stopped_; });
  }
  void release() {
    std::lock_guard lock(mu_);
    armed_ = false;
    cv_.notify_all();
  }

  EventId record_event(StreamId stream) override {
    std::unique_lock lock(mu_);
    if (armed_) {
      stopped_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !armed_; });
      stopped_ = false;
    }
    return sim_.record_event(stream);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool stopped_ = false;
};

// Holds the allocator's device lock from another thread, stopped in record_event(): frees on
// `stream` leave a sweep to record, and process_events() records it.
class LockHolder {
 public:
  LockHolder(Allocator& a, GatedBackend& gate, StreamId stream) : gate_(gate) {
    a.deallocate(a.allocate(8 * MiB, stream));  // a free on `stream`: a sweep to record
    gate_.arm();
    thread_ = std::thread([&a] { a.process_events(); });
    gate_.wait_until_stopped();
  }
  ~LockHolder() { release(); }
  void release() {
    gate_.release();
    if (thread_.joinable()) thread_.join();
  }

 private:
  GatedBackend& gate_;
  std::thread thread_;
};

// Runs fn on another thread; true when it finished within `limit` (false: it is blocked, and
// is left to finish once the caller releases what blocks it).
template <class Fn>
bool finishes_within(std::future<void>& f, Fn fn, std::chrono::milliseconds limit) {
  f = std::async(std::launch::async, fn);
  return f.wait_for(limit) == std::future_status::ready;
}

// Stream caches exist only without a loop plan (the default plans loops); `text` may turn it on.
Config config(const char* text = "") {
  return Config::parse(std::string("loop_plan:False,") + text);
}

// Frees `p` while another thread holds the device lock; fails if the free waited for it.
void free_while_locked(Allocator& a, GatedBackend& gate, void* p) {
  std::future<void> f;  // before the holder: destroyed after it has released the lock
  LockHolder holder(a, gate, 2);
  ASSERT_TRUE(finishes_within(
      f, [&] { a.deallocate(p); }, 10s))
      << "a contended free waited for the device lock";
  f.get();
}

TEST(StreamCache, ContendedFreesAreParkedAndTakenBackWithoutTheDeviceLock) {
  SimBackend sim(sim_options(1 * GiB, 1));
  GatedBackend gate(sim);
  Allocator a(gate, config());
  constexpr StreamId s1 = 1, s2 = 2;
  void* large = a.allocate(4 * MiB, s1);
  void* small = a.allocate(64 * KiB, s1);
  std::future<void> f;  // before the holder: destroyed after it has released the lock
  LockHolder holder(a, gate, s2);
  void* large2 = nullptr;
  void* small2 = nullptr;
  const bool done = finishes_within(
      f,
      [&] {
        a.deallocate(large);
        a.deallocate(small);
        small2 = a.allocate(64 * KiB - 100, s1);  // same size class
        large2 = a.allocate(4 * MiB, s1);
      },
      10s);
  ASSERT_TRUE(done) << "a contended free or allocation on its own stream waited for the lock";
  f.get();
  EXPECT_EQ(large2, large);
  EXPECT_EQ(small2, small);
  holder.release();

  const Stats s = a.stats();
  EXPECT_EQ(s.stream_cache_hits, 2);
  EXPECT_EQ(s.allocation[int(Pool::kAll)].current, 2);
  EXPECT_EQ(s.allocation[int(Pool::kSmall)].current, 1);
  EXPECT_EQ(s.requested_bytes[int(Pool::kAll)].current, std::int64_t(4 * MiB + 64 * KiB - 100));
  EXPECT_EQ(s.allocated_bytes[int(Pool::kAll)].freed,
            std::int64_t(8 * MiB + 4 * MiB + 64 * KiB));  // the holder's block, then the two
  EXPECT_NO_THROW(a.check_invariants());
  a.deallocate(large2);
  a.deallocate(small2);
  EXPECT_EQ(a.stats().allocation[int(Pool::kAll)].current, 0);
}

TEST(StreamCache, ParkedBlocksGoOnlyToTheirStreamAndBackToThePool) {
  SimBackend sim(sim_options(1 * GiB, 1));
  GatedBackend gate(sim);
  Allocator a(gate, config());
  void* p = a.allocate(6 * MiB, 1);
  ASSERT_NO_FATAL_FAILURE(free_while_locked(a, gate, p));
  Stats s = a.stats();
  EXPECT_EQ(s.stream_cached_bytes, std::int64_t(6 * MiB));
  EXPECT_EQ(a.memory_breakdown().stream_cached, 6 * MiB);
  EXPECT_EQ(s.allocated_bytes[int(Pool::kAll)].current, 0);
  EXPECT_EQ(s.inactive_split_bytes[int(Pool::kAll)].current,
            s.reserved_bytes[int(Pool::kAll)].current);
  EXPECT_EQ(a.fragmentation().free_bytes, std::size_t(s.reserved_bytes[int(Pool::kAll)].current));
  // Another stream does not get the parked block, whatever the lock.
  void* q = a.allocate(6 * MiB, 3);
  EXPECT_NE(q, p);
  EXPECT_NO_THROW(a.check_invariants());
  a.deallocate(q);
  // process_events() returns parked blocks to the pool: then they are ordinary free blocks.
  a.process_events();
  s = a.stats();
  EXPECT_EQ(s.stream_cached_bytes, 0);
  EXPECT_EQ(a.memory_breakdown().stream_cached, 0u);
  EXPECT_NO_THROW(a.check_invariants());
  // And release_cached() can then hand all of it back to the device.
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

TEST(StreamCache, OutOfMemoryReclaimsParkedBlocks) {
  SimBackend sim(sim_options(64 * MiB, 1));
  GatedBackend gate(sim);
  Allocator a(gate, config());
  void* p = a.allocate(24 * MiB, 1);
  void* held = a.allocate(24 * MiB, 2);
  ASSERT_NO_FATAL_FAILURE(free_while_locked(a, gate, p));
  // 40 MiB on stream 3 fits only with the parked 24 MiB given back.
  void* big = nullptr;
  ASSERT_NO_THROW(big = a.allocate(40 * MiB, 3));
  EXPECT_EQ(a.stats().stream_cached_bytes, 0);
  EXPECT_NO_THROW(a.check_invariants());
  a.deallocate(big);
  a.deallocate(held);
}

TEST(StreamCache, FullCacheOrZeroBytesOrRecordStreamWaitForTheLock) {
  struct Case {
    const char* config;
    std::size_t first, second;  // freed in this order while the lock is held
    bool record_stream;         // the second block was used on another stream
    std::size_t cached_after;   // bytes still parked afterwards (a full cache is drained)
  };
  for (const Case& c : {Case{"stream_cache_bytes:0", 4 * MiB, 4 * MiB, false, 0},
                        Case{"stream_cache_bytes:8MiB", 6 * MiB, 4 * MiB, false, 0},
                        Case{"", 4 * MiB, 4 * MiB, true, 4 * MiB}}) {
    SCOPED_TRACE(c.config);
    SimBackend sim(sim_options(1 * GiB, 1));
    GatedBackend gate(sim);
    Allocator a(gate, config(c.config));
    void* first = a.allocate(c.first, 1);
    void* second = a.allocate(c.second, 1);
    if (c.record_stream) a.record_stream(second, 5);
    std::future<void> f1, f2;
    LockHolder holder(a, gate, 2);
    const bool cached = std::string(c.config) != "stream_cache_bytes:0";
    if (cached) {
      ASSERT_TRUE(finishes_within(
          f1, [&] { a.deallocate(first); }, 10s));
      f1.get();
    }
    // Must wait: no cache, no room, or events to record under the lock.
    EXPECT_FALSE(finishes_within(
        f2, [&] { a.deallocate(second); }, 200ms));
    holder.release();
    f2.get();
    if (!cached) a.deallocate(first);
    const Stats s = a.stats();
    EXPECT_EQ(s.allocation[int(Pool::kAll)].current, 0);
    EXPECT_EQ(s.stream_cached_bytes, std::int64_t(c.cached_after));
    EXPECT_NO_THROW(a.check_invariants());
  }
}

// Once a stream's free met the lock taken, its frees park without trying the lock until the
// next drain (process_events), so sustained contention stays on the fast path.
TEST(StreamCache, AStreamKeepsParkingUntilTheNextDrain) {
  SimBackend sim(sim_options(1 * GiB, 1));
  GatedBackend gate(sim);
  Allocator a(gate, config());
  void* p = a.allocate(4 * MiB, 1);
  void* q = a.allocate(4 * MiB, 1);
  ASSERT_NO_FATAL_FAILURE(free_while_locked(a, gate, p));
  a.deallocate(q);  // uncontended now, but the stream is parking
  EXPECT_EQ(a.stats().stream_cached_bytes, std::int64_t(8 * MiB));
  a.process_events();  // drains and stops parking
  void* r = a.allocate(4 * MiB, 1);
  a.deallocate(r);
  EXPECT_EQ(a.stats().stream_cached_bytes, 0);
  EXPECT_EQ(a.stats().stream_cache_hits, 0);
  EXPECT_NO_THROW(a.check_invariants());
}

// A loop plan learns the loop from every request and free in order. A free parked in a stream
// cache (and the allocation that takes it back) would never reach the planner, so the loop it
// learns is not the job's: with PyTorch's autograd thread freeing while the main thread
// allocates, such a plan missed every step. Here one free of each iteration meets the lock taken.
TEST(StreamCache, UnderALoopPlanContendedFreesStillReachThePlan) {
  SimBackend sim(sim_options(1 * GiB, 1));
  GatedBackend gate(sim);
  Allocator a(gate, config("loop_plan:True"));
  constexpr int kRequests = 3;  // per iteration
  auto iteration = [&] {
    void* x = a.allocate(24 * MiB, 1);
    void* y = a.allocate(4 * MiB, 1);
    a.deallocate(x);
    // Held through with_device_lock(): LockHolder stops in record_event(), which a planned
    // loop's frees never reach.
    std::promise<void> locked, go;
    std::thread holder([&] {
      a.with_device_lock([&] {
        locked.set_value();
        go.get_future().wait();
      });
    });
    locked.get_future().wait();
    std::future<void> f = std::async(std::launch::async, [&] { a.deallocate(y); });
    f.wait_for(20ms);  // parked by now, where frees may park
    go.set_value();
    holder.join();
    f.get();
    void* z = a.allocate(8 * MiB, 2);
    a.deallocate(z);
  };
  for (int it = 0; it < 12; ++it) iteration();
  ASSERT_GE(a.stats().loop_plans, 1) << "the loop was never planned";
  const Stats before = a.stats();
  for (int it = 0; it < 4; ++it) iteration();
  const Stats after = a.stats();
  EXPECT_EQ(after.planned_allocations - before.planned_allocations, 4 * kRequests)
      << "stream cache hits: " << after.stream_cache_hits - before.stream_cache_hits;
  EXPECT_EQ(after.map_calls, before.map_calls) << "the plan in use still maps";
  EXPECT_NO_THROW(a.check_invariants());
}

TEST(StreamCache, DoubleFreeOfAParkedBlockIsRejected) {
  SimBackend sim(sim_options(1 * GiB, 1));
  GatedBackend gate(sim);
  Allocator a(gate, config());
  void* p = a.allocate(4 * MiB, 1);
  ASSERT_NO_FATAL_FAILURE(free_while_locked(a, gate, p));
  EXPECT_EQ(a.stats().stream_cached_bytes, std::int64_t(4 * MiB));
  EXPECT_THROW(a.deallocate(p), InvalidPointerError);  // parked, not live
  EXPECT_THROW(a.record_stream(p, 3), InvalidPointerError);
  EXPECT_NO_THROW(a.check_invariants());
}

// Pointers that are the live table's slot markers are rejected like any foreign pointer.
TEST(StreamCache, NullAndOneAreNotLive) {
  SimBackend sim(sim_options(1 * GiB, 1));
  Allocator a(sim, config());
  std::vector<void*> ps;
  for (int i = 0; i < 3000; ++i) ps.push_back(a.allocate(512, 1));     // every stripe in use
  for (std::size_t i = 0; i < ps.size(); i += 2) a.deallocate(ps[i]);  // erased slots
  EXPECT_THROW(a.record_stream(nullptr, 3), InvalidPointerError);
  EXPECT_THROW(a.record_stream(reinterpret_cast<void*>(1), 3), InvalidPointerError);
  EXPECT_THROW(a.deallocate(reinterpret_cast<void*>(1)), InvalidPointerError);
  EXPECT_NO_THROW(a.check_invariants());
  for (std::size_t i = 1; i < ps.size(); i += 2) a.deallocate(ps[i]);
}

// The fast path's statistics are folded decreases first, over every cache and pool, so a peak
// never reads higher than any value the statistics really had.
TEST(StreamCache, FoldedPeaksNeverOverRead) {
  SimBackend sim(sim_options(1 * GiB, 1));
  GatedBackend gate(sim);
  Allocator a(gate, config());
  void* large = a.allocate(4 * MiB, 1);
  void* small = a.allocate(64 * KiB, 1);
  ASSERT_NO_FATAL_FAILURE(free_while_locked(a, gate, small));  // stream 1 now parks
  a.reset_peak_stats();
  const std::int64_t before = a.stats().allocated_bytes[int(Pool::kAll)].current;
  a.deallocate(large);                     // parked: -4 MiB
  void* small2 = a.allocate(64 * KiB, 1);  // taken from the cache: +64 KiB
  const Stats s = a.stats();
  EXPECT_EQ(s.stream_cache_hits, 1);
  EXPECT_EQ(s.allocated_bytes[int(Pool::kAll)].peak, before);
  EXPECT_EQ(s.allocation[int(Pool::kAll)].peak, 1);
  a.deallocate(small2);
}

// Threads on their own streams, random sizes, frees of their own blocks, record_stream onto
// other streams, and a thread calling process_events() and stats(): no two live blocks ever
// overlap (checked as blocks are handed out), and everything adds up afterwards. Run under
// ThreadSanitizer by tools/test.sh.
TEST(StreamCache, ThreadsOnTheirOwnStreamsNeverShareABlock) {
  SimBackend sim(sim_options(8 * GiB, 2));
  Allocator a(sim, config("stream_cache_bytes:64MiB"));
  std::mutex owner_mu;
  std::map<DevicePtr, std::size_t> owned;  // live blocks by address: size
  std::atomic<int> overlaps{0};
  std::atomic<bool> stop{false};
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(7 + t);
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 4000; ++i) {
        if (mine.empty() || (mine.size() < 64 && rng() % 2)) {
          // A few sizes, so frees and allocations match in the caches.
          static constexpr std::size_t kSizes[] = {700, 64 * KiB, 3 * MiB, 8 * MiB};
          const std::size_t n = kSizes[rng() % 4];
          void* p = a.allocate(n, StreamId(t + 1));
          std::lock_guard lock(owner_mu);
          const DevicePtr d = addr(p);
          auto next = owned.lower_bound(d);
          if (next != owned.end() && next->first < d + n) ++overlaps;
          if (next != owned.begin() && std::prev(next)->first + std::prev(next)->second > d)
            ++overlaps;
          owned.emplace(d, n);
          mine.emplace_back(p, n);
        } else {
          const std::size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          mine[k] = mine.back();
          mine.pop_back();
          if (rng() % 8 == 0) a.record_stream(p, StreamId((t + 1) % kThreads + 1));
          {
            std::lock_guard lock(owner_mu);
            owned.erase(addr(p));
          }
          a.deallocate(p);
        }
      }
      for (auto [p, n] : mine) {
        {
          std::lock_guard lock(owner_mu);
          owned.erase(addr(p));
        }
        a.deallocate(p);
      }
    });
  }
  std::thread poller([&] {
    while (!stop.load()) {
      a.process_events();
      (void)a.stats();
      std::this_thread::yield();
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  poller.join();
  EXPECT_EQ(overlaps.load(), 0) << "two live blocks overlapped";
  ASSERT_NO_THROW(a.check_invariants());
  const Stats s = a.stats();
  EXPECT_EQ(s.allocation[int(Pool::kAll)].current, 0);
  EXPECT_EQ(s.allocated_bytes[int(Pool::kAll)].current, 0);
  EXPECT_EQ(s.requested_bytes[int(Pool::kAll)].current, 0);
  EXPECT_EQ(s.allocation[int(Pool::kAll)].allocated, s.allocation[int(Pool::kAll)].freed);
  a.release_cached();
  EXPECT_EQ(sim.physical_bytes(), 0u);
}

}  // namespace
