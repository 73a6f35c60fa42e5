// The .cuat reader's gzip rules and limits (trace/FORMAT.md, "Gzip" and "Limits"): what Python's
// gzip module (the reference reader's) accepts is read, the rest refused in one line naming the
// file, and a file past a limit is refused before the memory it would take is committed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cuarena/replay/trace.hpp"
#include "gzip_member.hpp"

using namespace cuarena::replay;
using cuarena::test::gzip;
namespace cuat = cuarena::cuat;

namespace {

using Bytes = std::string;

template <class T>
void put_le(Bytes& b, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) b.push_back(char(std::uint64_t(v) >> (8 * i)));
}

Bytes header(std::uint64_t count) {
  Bytes b = "CUATRACE";
  put_le<std::uint32_t>(b, 1);
  put_le<std::uint32_t>(b, 40);
  put_le<std::uint64_t>(b, count);
  put_le<std::uint64_t>(b, 0);
  return b;
}

Bytes record(Action action, std::uint16_t device = 0, std::uint64_t stream = 0,
             std::uint64_t addr = 0x1000) {
  Bytes b;
  b.push_back(char(action));
  b.push_back(0);
  put_le<std::uint16_t>(b, device);
  put_le<std::uint32_t>(b, 0);
  put_le<std::uint64_t>(b, stream);
  put_le<std::uint64_t>(b, addr);
  put_le<std::uint64_t>(b, 512);
  put_le<std::int64_t>(b, 7);
  return b;
}

// `n` records: allocs and frees of one block, as a trace of a loop holds them.
Bytes pairs(std::size_t n) {
  const Bytes two = record(Action::kAlloc) + record(Action::kFreeCompleted);
  Bytes b;
  for (std::size_t i = 0; i < n / 2; ++i) b += two;
  if (n % 2) b += record(Action::kAlloc);
  return b;
}

struct TempFile {
  std::string path;
  TempFile() {
    static int n = 0;
    path =
        "/tmp/cuarena-limits-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".cuat";
  }
  explicit TempFile(const Bytes& data) : TempFile() { write(data); }
  ~TempFile() { std::remove(path.c_str()); }
  void write(const Bytes& data) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(data.data(), std::streamsize(data.size()));
  }
};

// What reading `path` gives: "" when it reads, else the TraceError's message.
std::string refusal(const std::string& path) {
  try {
    read_cuat(path);
    return "";
  } catch (const TraceError& e) {
    return e.what();
  }
}

const Bytes kImage = header(6) + pairs(6);

TEST(TraceGzip, ATrailerCutOffIsRefused) {
  const Bytes gz = gzip(kImage);
  for (std::size_t cut = 1; cut <= 8; ++cut) {  // the CRC-32 and length: 8 bytes
    TempFile f(gz.substr(0, gz.size() - cut));
    const std::string why = refusal(f.path);
    EXPECT_EQ(why, f.path + ": truncated gzip data (the file ends inside a gzip member, before " +
                       "its CRC-32 and length trailer)")
        << "cut " << cut;
  }
}

TEST(TraceGzip, BytesAfterTheLastMemberAreRefused) {
  const Bytes gz = gzip(kImage);
  for (const Bytes& tail : {Bytes("garbage!"), Bytes("\x1f"), Bytes("\0\0\0x", 4), Bytes("\n")}) {
    TempFile f(gz + tail);
    const std::string why = refusal(f.path);
    EXPECT_EQ(why.rfind(f.path + ": trailing bytes after the gzip data (at byte ", 0), 0u) << why;
  }
  TempFile f(gz + "\x1f\x8b");  // a member that never starts: cut short
  EXPECT_NE(refusal(f.path).find(": truncated gzip data"), std::string::npos) << refusal(f.path);
}

TEST(TraceGzip, AWrongCrcOrLengthIsRefused) {
  const Bytes gz = gzip(kImage);
  for (std::size_t at : {gz.size() - 8, gz.size() - 4}) {
    Bytes bad = gz;
    bad[at] = char(bad[at] ^ 1);
    TempFile f(bad);
    EXPECT_EQ(refusal(f.path).rfind(f.path + ": corrupt gzip data (incorrect ", 0), 0u)
        << refusal(f.path);
  }
}

// As Python's gzip module: members one after another are one content, and NUL bytes may pad it.
TEST(TraceGzip, MembersInARowAndNulPaddingAreRead) {
  TempFile plain(kImage);
  const std::vector<Event> want = read_cuat(plain.path);
  ASSERT_EQ(want.size(), 6u);
  TempFile members(gzip(kImage.substr(0, 50)) + gzip(kImage.substr(50, 100)) + gzip("") +
                   gzip(kImage.substr(150)) + Bytes(16, '\0'));
  const std::vector<Event> got = read_cuat(members.path);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].action, want[i].action);
    EXPECT_EQ(got[i].addr, want[i].addr);
  }
}

// The fuzzing campaign's 10^8 and 4x10^8 well-formed records (zeros: allocs of 0 bytes at 0) in 4
// and 16 MB of gzip, 1 MB members repeated: read whole they took 24-43 s and 3.9 GB, and 4x10^8
// ended in std::bad_alloc.
TEST(TraceLimits, AHeaderPromisingMoreRecordsThanTheLimitIsRefusedBeforeReadingThem) {
  const Bytes member = gzip(Bytes(1'000'000, '\0'), 9);  // 25000 records
  for (const std::uint64_t count : {std::uint64_t{100'000'000}, std::uint64_t{400'000'000}}) {
    Bytes gz = gzip(header(count));
    for (std::uint64_t i = 0; i < count / 25000; ++i) gz += member;
    // Large enough for its records by deflate's largest expansion: only the limit refuses it.
    ASSERT_GE(std::uint64_t(gz.size()) * 1032, count * 40);
    TempFile f(gz);
    EXPECT_EQ(refusal(f.path), f.path + ": header promises " + std::to_string(count) +
                                   " events, more than a trace may hold (67108864, 2.50 GiB "
                                   "decompressed; trace/FORMAT.md)");
  }
}

// A sparse file as large as its header says: the limit is checked before any record is read.
TEST(TraceLimits, TheRecordLimitIsExact) {
  for (const std::uint64_t count : {cuat::kMaxEvents, cuat::kMaxEvents + 1}) {
    TempFile f(header(count) + record(Action(9)));  // record 0 is refused if it is read
    ASSERT_EQ(::truncate(f.path.c_str(), off_t(32 + count * 40)), 0);
    const std::string why = refusal(f.path);
    if (count == cuat::kMaxEvents)
      EXPECT_EQ(why, f.path + ": record 0: unknown action code 9");
    else
      EXPECT_NE(why.find("events, more than a trace may hold"), std::string::npos) << why;
  }
}

TEST(TraceLimits, DevicesAre0To127) {
  TempFile ok(header(2) + record(Action::kAlloc, 0) + record(Action::kAlloc, 127));
  EXPECT_EQ(refusal(ok.path), "");
  TempFile bad(header(2) + record(Action::kAlloc, 0) + record(Action::kAlloc, 128));
  EXPECT_EQ(refusal(bad.path), bad.path + ": record 1: device 128 (devices are 0 to 127)");
}

TEST(TraceLimits, StreamsAreCountedPerDevice) {
  const std::uint64_t n = cuat::kMaxStreamsPerDevice;
  Bytes full;
  for (std::uint16_t device : {0, 1})
    for (std::uint64_t s = 0; s < n; ++s) full += record(Action::kAlloc, device, s, 16 * s + 16);
  TempFile ok(header(2 * n) + full);
  EXPECT_EQ(refusal(ok.path), "");  // the most on each of two devices
  TempFile bad(header(n + 1) + full.substr(0, n * 40) + record(Action::kAlloc, 0, n));
  EXPECT_EQ(refusal(bad.path), bad.path + ": record 131072: more than 131072 streams on device 0");
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CUARENA_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CUARENA_SANITIZED 1
#endif
#endif

// Below the limits memory can still run out: a TraceError too, never std::bad_alloc. A child
// process reads 200 MB of records with 96 MB of address space to spare.
TEST(TraceLimits, RunningOutOfMemoryIsATraceError) {
#ifdef CUARENA_SANITIZED
  GTEST_SKIP() << "a sanitizer's shadow memory needs the address space that this test limits";
#else
  const std::size_t n = 5'000'000;
  TempFile f(header(n) + pairs(n));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + (rlim_t{96} << 20);
    const rlimit r{limit, limit};
    ::setrlimit(RLIMIT_AS, &r);
    int code = 2;
    try {
      read_cuat(f.path);
    } catch (const TraceError& e) {
      code =
          std::string(e.what()).find(": not enough memory to read its events") == std::string::npos
              ? 3
              : 0;
    } catch (...) {
      code = 4;  // std::bad_alloc
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: read, 3: another TraceError, 4: another exception";
#endif
}

std::string with_commas(std::uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(std::size_t(i), ",");
  return s;
}

// FORMAT.md's table states the limits the reader applies.
TEST(TraceLimits, FormatMdStatesThem) {
  std::ifstream in(CUARENA_FORMAT_MD);
  const std::string md{std::istreambuf_iterator<char>(in), {}};
  const std::string rows[] = {
      "| records (`event_count`) | " + with_commas(cuat::kMaxEvents) + " (2^26) |",
      "| decompressed bytes | " + with_commas(cuat::kMaxImageBytes) + " (32 + 40 × 2^26) |",
      "| devices | indices 0 to " + std::to_string(cuat::kMaxDevices - 1) + " |",
      "| streams | " + with_commas(cuat::kMaxStreamsPerDevice) +
          " (2^17) distinct streams per device |"};
  for (const std::string& row : rows) EXPECT_NE(md.find(row), std::string::npos) << row;
  EXPECT_EQ(cuat::kMaxEvents, std::uint64_t{1} << 26);
  EXPECT_EQ(cuat::kMaxStreamsPerDevice, std::uint64_t{1} << 17);
}

}  // namespace
