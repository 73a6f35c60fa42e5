// MonitorPublisher over the simulated device: the page it writes, read back through shm_open
// under the sequence lock, holds what the allocator reports, follows it, and goes with it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "monitor_test_support.hpp"

namespace cuarena::monitor::test {
namespace {

struct Expected {
  Stats stats;
  Allocator::MemoryBreakdown breakdown;
  std::size_t largest_free;
  std::size_t limit;
};

Expected expected(const Allocator& a) {
  return {a.stats(), a.memory_breakdown(), a.fragmentation().largest_free, a.memory_limit()};
}

// The page once it shows the allocator's current figures (the walks included).
std::optional<MonitorPage> page_showing(const std::string& name, const Expected& e) {
  std::optional<MonitorPage> page;
  const auto& b = e.breakdown;
  const std::int64_t reclaimable =
      std::int64_t(b.owned_cached + b.shared_cached + b.idle + b.slab_free + b.stream_cached);
  eventually([&] {
    page = read_page(name);
    return page && page->allocations == e.stats.allocation[0].allocated &&
           page->allocated_bytes == e.stats.allocated_bytes[0].current &&
           page->reclaimable_bytes == reclaimable &&
           page->largest_free_bytes == std::int64_t(e.largest_free);
  });
  return page;
}

TEST(MonitorPublisher, PageHoldsTheAllocatorsFigures) {
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  std::vector<void*> blocks;
  for (std::size_t bytes :
       {std::size_t{4096}, std::size_t{300} << 10, std::size_t{48} << 20, std::size_t{7} << 20})
    blocks.push_back(alloc.allocate(bytes, 0));
  alloc.deallocate(blocks[2]);  // some cached memory: reclaimable, largest_free
  alloc.deallocate(blocks[0]);  // a free slab slot

  MonitorPublisher pub(alloc, options(901));
  ASSERT_TRUE(pub.publishing());
  EXPECT_EQ(pub.page_name(),
            "/cuarena." + std::to_string(geteuid()) + "." + std::to_string(getpid()) + ".901");
  const Expected e = expected(alloc);
  const std::optional<MonitorPage> page = page_showing(pub.page_name(), e);
  ASSERT_TRUE(page);
  const MonitorPage& p = *page;
  const Stats& s = e.stats;

  EXPECT_EQ(std::memcmp(p.magic, kMonitorMagic, 8), 0);
  EXPECT_EQ(p.version, kMonitorVersion);
  EXPECT_EQ(p.page_bytes, sizeof(MonitorPage));
  EXPECT_EQ(p.seq % 2, 0u);
  EXPECT_EQ(p.pid, getpid());
  EXPECT_EQ(p.device, 901);
  EXPECT_EQ(p.kind, std::uint32_t(PageKind::kReplayer));
  EXPECT_GT(p.start_ns, 0u);
  EXPECT_GE(p.update_ns, p.start_ns);
  EXPECT_STREQ(p.device_uuid, "GPU-00000000-1111-2222-3333-444444444444");
  EXPECT_NE(std::string(p.command).find("monitor_tests"), std::string::npos) << p.command;

  EXPECT_EQ(p.reserved_bytes, s.reserved_bytes[0].current);
  EXPECT_EQ(p.reserved_peak_bytes, s.reserved_bytes[0].peak);
  EXPECT_EQ(p.allocated_bytes, s.allocated_bytes[0].current);
  EXPECT_EQ(p.allocated_peak_bytes, s.allocated_bytes[0].peak);
  EXPECT_EQ(p.requested_bytes, s.requested_bytes[0].current);
  EXPECT_EQ(p.requested_peak_bytes, s.requested_bytes[0].peak);
  EXPECT_EQ(p.active_bytes, s.active_bytes[0].current);
  EXPECT_GT(p.reclaimable_bytes, 0);
  EXPECT_GE(p.largest_free_bytes, std::int64_t(48) << 20);
  EXPECT_EQ(p.limit_bytes, std::int64_t(e.limit));
  EXPECT_EQ(p.available_bytes,
            available_bytes(std::int64_t(kCapacity) - s.reserved_bytes[0].current, e.breakdown,
                            s.reserved_bytes[0].current, std::int64_t(e.limit)));
  EXPECT_EQ(p.device_total_bytes, std::int64_t(kCapacity));
  EXPECT_EQ(p.driver_calls,
            s.map_calls + s.unmap_calls + s.access_calls + s.num_device_alloc + s.num_device_free);
  EXPECT_GT(p.driver_calls, 0);
  EXPECT_EQ(p.num_ooms, s.num_ooms);
  EXPECT_EQ(p.num_alloc_retries, s.num_alloc_retries);
  EXPECT_EQ(p.allocations, 4);
  EXPECT_EQ(p.memory_first, s.memory_first);
  for (std::int64_t v : p.spare) EXPECT_EQ(v, 0);

  // The object itself: the user's alone, one page long.
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + pub.page_name()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(std::size_t(st.st_size), kMonitorPageBytes);
  EXPECT_EQ(st.st_uid, geteuid());
  for (void* b : blocks)
    if (b != blocks[0] && b != blocks[2]) alloc.deallocate(b);
}

TEST(MonitorPublisher, FollowsAllocationsWithinATick) {
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  MonitorPublisher pub(alloc, options(902));
  const std::optional<MonitorPage> first = published(pub.page_name());
  ASSERT_TRUE(first);
  EXPECT_EQ(first->allocated_bytes, 0);
  EXPECT_EQ(first->reserved_bytes, 0);

  void* big = alloc.allocate(std::size_t{64} << 20, 0);
  std::optional<MonitorPage> now = page_showing(pub.page_name(), expected(alloc));
  ASSERT_TRUE(now);
  EXPECT_EQ(now->allocated_bytes, std::int64_t{64} << 20);
  EXPECT_GE(now->reserved_bytes, std::int64_t{64} << 20);
  EXPECT_GT(now->update_ns, first->update_ns);
  EXPECT_GT(now->seq, first->seq);

  alloc.deallocate(big);
  now = page_showing(pub.page_name(), expected(alloc));
  ASSERT_TRUE(now);
  EXPECT_EQ(now->allocated_bytes, 0);
  EXPECT_EQ(now->allocated_peak_bytes, std::int64_t{64} << 20);
  EXPECT_GE(now->reclaimable_bytes, std::int64_t{64} << 20);  // cached, not released
}

TEST(MonitorPublisher, RemovesThePageWhenDestroyed) {
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  auto pub = std::make_unique<MonitorPublisher>(alloc, options(903));
  const std::string name = pub->page_name();
  ASSERT_TRUE(published(name));
  ASSERT_TRUE(page_exists(name));
  pub.reset();
  EXPECT_FALSE(page_exists(name));
  EXPECT_FALSE(read_page(name));
}

TEST(MonitorPublisher, ReplacesAStalePageOfItsPid) {
  // A page left by an earlier process of this pid (pid reuse, or this one before exec).
  const std::string name = MonitorPublisher::page_name(geteuid(), getpid(), 904);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  close(fd);
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  MonitorPublisher pub(alloc, options(904));
  ASSERT_TRUE(pub.publishing());
  const std::optional<MonitorPage> page = published(name);
  ASSERT_TRUE(page);
  EXPECT_EQ(page->device, 904);
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(MonitorPublisher, AFailedShmOpenLeavesTheProgramAlone) {
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  MonitorPublisher::Options o = options(905);
  o.name = "/cuarena/not/a/valid/name";  // shm_open refuses a name with a second '/'
  std::vector<std::string> lines;
  o.log = [&](const std::string& line) { lines.push_back(line); };
  std::unique_ptr<MonitorPublisher> pub;
  ASSERT_NO_THROW(pub = std::make_unique<MonitorPublisher>(alloc, o));
  EXPECT_FALSE(pub->publishing());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("shm_open /cuarena/not/a/valid/name"), std::string::npos) << lines[0];
  void* p = alloc.allocate(1 << 20, 0);  // the allocator is unaffected
  EXPECT_NE(p, nullptr);
  alloc.deallocate(p);
  EXPECT_NO_THROW(pub.reset());
}

TEST(MonitorPublisher, ASecondPublisherOfThePageLeavesTheFirstAlone) {
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  MonitorPublisher first(alloc, options(906));
  ASSERT_TRUE(published(first.page_name()));
  const std::uint64_t start = read_page(first.page_name())->start_ns;
  {
    MonitorPublisher second(alloc, options(906));
    EXPECT_FALSE(second.publishing());
  }
  // Neither replaced nor removed: still the first's page, still rewritten.
  ASSERT_TRUE(page_exists(first.page_name()));
  const std::uint64_t seq = read_page(first.page_name())->seq;
  EXPECT_TRUE(eventually([&] {
    const auto p = read_page(first.page_name());
    return p && p->start_ns == start && p->seq > seq;
  }));
}

TEST(MonitorPublisher, ReadsWhileThreadsAllocate) {
  // For ThreadSanitizer: the publisher's reads against allocations on other threads.
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  MonitorPublisher::Options o = options(907);
  o.interval = std::chrono::milliseconds(1);
  MonitorPublisher pub(alloc, o);
  std::vector<std::thread> threads;
  for (StreamId stream : {StreamId{1}, StreamId{2}}) {
    threads.emplace_back([&alloc, stream] {
      for (int i = 0; i < 2000; ++i) {
        void* p = alloc.allocate(std::size_t(1 + i % 7) << (i % 2 ? 10 : 20), stream);
        alloc.deallocate(p);
      }
    });
  }
  for (auto& t : threads) t.join();
  alloc.process_events();
  const std::optional<MonitorPage> page = page_showing(pub.page_name(), expected(alloc));
  ASSERT_TRUE(page);
  EXPECT_EQ(page->allocations, 4000);
  EXPECT_EQ(page->allocated_bytes, 0);
}

}  // namespace
}  // namespace cuarena::monitor::test
