// The out-of-memory error's text: what a user needs to decide what to do next.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"

using namespace cuarena;
using namespace cuarena::test;

TEST(OutOfMemoryMessage, NamesTheRequestWhatIsHeldTheLargestBlockAndTheReplay) {
  SimBackend sim(sim_options(64 * MiB));
  Allocator a(sim);
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(a.allocate(8 * MiB, 1));  // the whole device
  a.deallocate(blocks[3]);  // 8 MiB free inside reserved memory, none left on the device
  try {
    a.allocate(12 * MiB, 1);
    FAIL() << "12 MiB fit a full 64 MiB device with 8 MiB free";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    for (const char* part : {"tried to allocate 12.00 MiB", "64.00 MiB reserved",
                             "56.00 MiB is allocated", "8.00 MiB is reserved but unallocated",
                             "the largest block it could build is at most 8.00 MiB",
                             "CUARENA_TRACE=", "cuarena replay oom.cuat --min-capacity"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
  for (void* p : blocks)
    if (p != blocks[3]) a.deallocate(p);
}
