// The page's sequence lock, and what the integrations put into a page (available bytes, the
// device UUID's text, the CUARENA_MONITOR switch).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "cuarena/monitor_publisher.hpp"
#include "cuarena/monitor_reader.hpp"
#include "seqlock.hpp"

namespace cuarena::monitor {
namespace {

TEST(MonitorSeqlock, ACopyNeverMixesTwoWrites) {
  // Every write sets all the figures to one value: a consistent copy holds one value only. The
  // writer goes on until the reader has copied often (a loaded machine may not run the reader
  // at all during a fixed number of writes).
  MonitorPage page{};
  std::atomic<bool> done{false};
  std::atomic<int> copies{0};
  std::atomic<std::int64_t> writes{0};
  std::thread writer([&] {
    std::int64_t v = 0;
    while (++v < 20000 || (copies.load() < 200 && v < 200'000'000)) {
      detail::begin_write(page);
      for (std::int64_t* f = &page.reserved_bytes; f <= &page.spare[74]; ++f) detail::put(*f, v);
      detail::end_write(page);
    }
    writes = v - 1;
    done = true;
  });
  while (!done) {
    MonitorPage copy;
    if (!copy_page(page, copy)) continue;
    ++copies;
    EXPECT_EQ(copy.seq % 2, 0u);
    for (const std::int64_t* f = &copy.reserved_bytes; f <= &copy.spare[74]; ++f)
      ASSERT_EQ(*f, copy.reserved_bytes) << "torn copy at seq " << copy.seq;
  }
  writer.join();
  EXPECT_GT(copies.load(), 0);
  MonitorPage last;
  ASSERT_TRUE(copy_page(page, last));
  EXPECT_EQ(last.reserved_bytes, writes.load());
  EXPECT_EQ(last.seq, 2 * std::uint64_t(writes.load()));  // two steps per write
}

TEST(MonitorSeqlock, APageBeingWrittenIsNotCopied) {
  MonitorPage page{};
  detail::begin_write(page);
  MonitorPage copy;
  EXPECT_FALSE(copy_page(page, copy, 10));
  detail::end_write(page);
  EXPECT_TRUE(copy_page(page, copy, 10));
}

TEST(MonitorInputs, AvailableBytesAsMemoryAvailableCountsThem) {
  Allocator::MemoryBreakdown b;
  b.owned_cached = 10;
  b.shared_cached = 20;
  b.idle = 30;
  b.retired = 4;           // reusable once its event completes
  b.slab_free = 1000;      // not reusable by a large request
  b.stream_cached = 2000;  // in use until it returns
  EXPECT_EQ(reusable_bytes(b), 64);
  // Device-bound: free + cached.
  EXPECT_EQ(available_bytes(100, b, 500, 10'000), 164);
  // Limit-bound: limit - reserved + cached.
  EXPECT_EQ(available_bytes(100'000, b, 500, 1'000), 564);
  // Reserved above the limit (fraction lowered): only the cache.
  EXPECT_EQ(available_bytes(100'000, b, 2'000, 1'000), 64);
  EXPECT_EQ(available_bytes(-1, b, 0, 1'000), -1);
}

TEST(MonitorInputs, GpuUuidAsNvmlWritesIt) {
  const char bytes[16] = {char(0x8f), 0x1b,       0x2c,       0x3d,       0x4e,       0x5f,
                          0x60,       0x71,       char(0x82), char(0x93), char(0xa4), char(0xb5),
                          char(0xc6), char(0xd7), char(0xe8), char(0xff)};
  EXPECT_EQ(format_gpu_uuid(bytes), "GPU-8f1b2c3d-4e5f-6071-8293-a4b5c6d7e8ff");
}

TEST(MonitorInputs, CuarenaMonitorZeroTurnsItOff) {
  const char* saved = std::getenv("CUARENA_MONITOR");
  const std::string keep = saved ? saved : "";
  unsetenv("CUARENA_MONITOR");
  EXPECT_TRUE(monitor_enabled());
  for (const char* off : {"0", "false", "OFF"}) {
    setenv("CUARENA_MONITOR", off, 1);
    EXPECT_FALSE(monitor_enabled()) << off;
  }
  for (const char* on : {"1", "", "yes"}) {
    setenv("CUARENA_MONITOR", on, 1);
    EXPECT_TRUE(monitor_enabled()) << on;
  }
  if (saved)
    setenv("CUARENA_MONITOR", keep.c_str(), 1);
  else
    unsetenv("CUARENA_MONITOR");
}

}  // namespace
}  // namespace cuarena::monitor
