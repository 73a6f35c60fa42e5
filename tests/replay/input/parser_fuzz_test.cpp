// Seeded mutation fuzzing of the two parsers that take outside input in C++: the `.cuat` reader
// (read_cuat) and the config parser (Config::parse, parse_size). Every mutated input must either
// parse or be refused with the parser's own error type and a short message; a crash, another
// exception type (std::bad_alloc, std::out_of_range, ...) or a message that quotes megabytes
// fails the test. Fixed seeds, a fixed number of iterations and a wall-clock cap keep it
// deterministic and bounded for CI (ctest runs it in tools/test.sh, also under ASan): a few
// seconds here, 15 s at most per test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/replay/trace.hpp"
#include "gzip_member.hpp"

using namespace cuarena;
using namespace cuarena::replay;
using cuarena::test::gzip;

namespace {

using Bytes = std::string;
using Clock = std::chrono::steady_clock;

constexpr int kIterations = 10000;
constexpr auto kTimeCap = std::chrono::seconds(15);  // stop early rather than stall CI
constexpr std::size_t kMaxMessage = 1200;            // a message quotes at most 200 characters

std::string trace_path(const std::string& name) {
  return std::string(CUARENA_TRACE_DIR) + "/" + name;
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const Bytes& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), std::streamsize(data.size()));
}

// A temporary file name for this process, removed at the end.
struct TempFile {
  std::string path = "/tmp/cuarena-fuzz-" + std::to_string(::getpid()) + ".cuat";
  ~TempFile() { std::remove(path.c_str()); }
};

template <class T>
void put_le(Bytes& b, std::size_t at, T v) {
  for (std::size_t i = 0; i < sizeof(T) && at + i < b.size(); ++i)
    b[at + i] = char(std::uint64_t(v) >> (8 * i));
}

// The seeds: real events (the start of a bundled trace, converted) and a synthetic trace with
// every action, several devices and streams, each as written and gzipped; then the fuzzing
// campaign's findings (FORMAT.md, "Gzip" and "Limits"): a gzip trailer cut off, bytes after the
// gzip member, NUL padding and members in a row, device 128, and 10^8 records of zeros in 4 MB.
std::vector<Bytes> cuat_corpus(const TempFile& tmp) {
  std::vector<Event> real = load_trace(trace_path("resnet50_amp.pickle.gz"));
  real.resize(std::min<std::size_t>(real.size(), 200));
  std::vector<Event> synthetic;
  const Action actions[] = {Action::kAlloc,        Action::kFreeRequested, Action::kFreeCompleted,
                            Action::kSegmentAlloc, Action::kSegmentFree,   Action::kSegmentMap,
                            Action::kSegmentUnmap, Action::kOom,           Action::kSnapshot,
                            Action::kOther};
  for (std::uint16_t device = 0; device < 3; ++device)
    for (int i = 0; i < 20; ++i)
      synthetic.push_back({actions[i % 10], device, std::uint64_t(i % 3) * 0x1000,
                           0x7f0000000000 + std::uint64_t(i) * 4096, std::uint64_t(i) << 20, i});
  std::vector<Bytes> corpus;
  for (const auto& events : {real, synthetic, std::vector<Event>{}}) {
    write_cuat(tmp.path, events);
    corpus.push_back(read_file(tmp.path));
    corpus.push_back(gzip(corpus.back()));
  }
  const Bytes image = corpus[2], gz = corpus[3];  // the synthetic trace
  corpus.push_back(gz.substr(0, gz.size() - 8));
  corpus.push_back(gz.substr(0, gz.size() - 3));
  corpus.push_back(gz + "garbage!");
  corpus.push_back(gz + Bytes(8, '\0'));
  corpus.push_back(gzip(image.substr(0, 100)) + gzip(image.substr(100)));
  Bytes device128 = image;
  put_le<std::uint16_t>(device128, device128.size() - 38, 128);  // the last record's device
  corpus.push_back(device128);
  Bytes header = image.substr(0, 32);
  put_le<std::uint64_t>(header, 16, 100'000'000);
  Bytes bomb = gzip(header);
  const Bytes member = gzip(Bytes(1'000'000, '\0'), 9);  // 25000 records of zeros
  for (int i = 0; i < 4000; ++i) bomb += member;
  corpus.push_back(bomb);
  return corpus;
}

// One mutation of `b`: bit flips, interesting bytes and 64-bit values (header fields included),
// truncation, growth, record copies and deletions, and gzip on top.
Bytes mutate(Bytes b, std::mt19937_64& rng) {
  static const std::uint64_t interesting[] = {0,
                                              1,
                                              40,
                                              0x7f,
                                              0xff,
                                              0xffff,
                                              std::uint64_t{1} << 32,
                                              std::uint64_t{1} << 34,
                                              (std::uint64_t{1} << 34) + 1,
                                              kMaxDeviceBytes,
                                              kMaxDeviceBytes + 1,
                                              127,
                                              128,
                                              cuat::kMaxEvents,
                                              cuat::kMaxEvents + 1,
                                              100'000'000,
                                              std::uint64_t{1} << 63,
                                              ~std::uint64_t{0}};
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : std::size_t(rng() % n); };
  const int rounds = 1 + int(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 9) {
      case 0:  // flip bits
        for (int k = 1 + int(rng() % 8); k > 0 && !b.empty(); --k)
          b[pick(b.size())] ^= char(1 << (rng() % 8));
        break;
      case 1:  // an interesting byte
        if (!b.empty()) b[pick(b.size())] = char(interesting[pick(std::size(interesting))]);
        break;
      case 2:  // an interesting 64-bit value anywhere
        put_le<std::uint64_t>(b, pick(b.size()), interesting[pick(std::size(interesting))]);
        break;
      case 3:  // a header field: version, record size or event count
        put_le<std::uint32_t>(b, 8 + 4 * pick(2),
                              std::uint32_t(interesting[pick(std::size(interesting))]));
        put_le<std::uint64_t>(b, 16,
                              rng() % 2 ? interesting[pick(std::size(interesting))]
                                        : (b.size() - 32) / 40 + pick(3) - 1);
        break;
      case 4:  // truncate
        b.resize(pick(b.size() + 1));
        break;
      case 5:  // append random bytes
        for (int k = int(rng() % 64); k > 0; --k) b.push_back(char(rng()));
        break;
      case 6:  // copy a record-sized piece elsewhere
        if (b.size() > 80) {
          const std::size_t from = pick(b.size() - 40), to = pick(b.size() - 40);
          b.replace(to, 40, b.substr(from, 40));
        }
        break;
      case 7:  // delete a record-sized piece
        if (b.size() > 72) b.erase(32 + pick(b.size() - 72), 40);
        break;
      case 8:  // compress what there is (the reader takes gzip transparently)
        b = gzip(b);
        break;
    }
  }
  return b;
}

TEST(Fuzz, CuatReaderRefusesOrReadsEveryMutationWithATraceError) {
  TempFile tmp;
  const std::vector<Bytes> corpus = cuat_corpus(tmp);
  std::mt19937_64 rng(20261201);
  const auto start = Clock::now();
  int done = 0, read_ok = 0;
  for (; done < kIterations && Clock::now() - start < kTimeCap; ++done) {
    // The 4 MB seed (the last) costs more than the rest together: one input in 64.
    const std::size_t seed = rng() % 64 == 0 ? corpus.size() - 1 : rng() % (corpus.size() - 1);
    const Bytes input = done < int(corpus.size()) ? corpus[std::size_t(done)]  // each seed as is
                                                  : mutate(corpus[seed], rng);
    write_file(tmp.path, input);
    try {
      const std::vector<Event> events = read_cuat(tmp.path);
      ++read_ok;
      ASSERT_LE(events.size(), cuat::kMaxEvents);  // what FORMAT.md promises of a good file
      for (std::size_t i = 1; i < events.size(); ++i)
        ASSERT_LE(events[i - 1].device, events[i].device) << "iteration " << done;
      for (const Event& e : events) {
        ASSERT_TRUE(e.size <= kMaxDeviceBytes || e.action == Action::kOom) << "iteration " << done;
        ASSERT_LT(e.device, cuat::kMaxDevices) << "iteration " << done;
      }
    } catch (const TraceError& e) {
      const std::string what = e.what();
      ASSERT_FALSE(what.empty()) << "iteration " << done;
      ASSERT_EQ(what.rfind(tmp.path + ": ", 0), 0u) << "iteration " << done << ": " << what;
      ASSERT_LT(what.size(), kMaxMessage) << "iteration " << done;
      ASSERT_EQ(what.find('\n'), std::string::npos) << "iteration " << done << ": " << what;
    } catch (const std::bad_alloc&) {
      FAIL() << "iteration " << done << ": std::bad_alloc on a " << input.size() << "-byte input";
    } catch (const std::exception& e) {
      FAIL() << "iteration " << done << ": " << typeid(e).name() << ": " << e.what();
    }
  }
  RecordProperty("iterations", done);
  RecordProperty("read", read_ok);
  EXPECT_GE(done, kIterations / 10) << "the time cap cut the run short";
  EXPECT_GT(read_ok, 0);                // some mutations leave a valid trace ...
  EXPECT_GT(done - read_ok, done / 2);  // ... and most are refused
}

// A header that claims 2^34 events over no records is refused as truncated, without first
// reserving room for the events it claims (640 GiB of them): the room is bounded by the file.
TEST(Fuzz, AHeaderClaimingBillionsOfEventsIsRefusedCheaply) {
  TempFile tmp;
  Bytes header = "CUATRACE";
  header.resize(32, '\0');
  put_le<std::uint32_t>(header, 8, 1);
  put_le<std::uint32_t>(header, 12, 40);
  put_le<std::uint64_t>(header, 16, std::uint64_t{1} << 34);
  for (const Bytes& image : {header, gzip(header)}) {
    write_file(tmp.path, image);
    try {
      read_cuat(tmp.path);
      FAIL() << "read";
    } catch (const TraceError& e) {
      EXPECT_NE(std::string(e.what()).find("truncated: header promises 17179869184 events"),
                std::string::npos)
          << e.what();
    }
  }
}

std::vector<std::string> config_corpus() {
  return {"",
          Config{}.to_string(),
          "small_limit:1MiB,size_classes_per_doubling:8",
          "whole_chunk_min:0",
          "per_process_memory_fraction:0.5,upstream:async,stream_alias:False",
          "va_reserve:80GiB,slab_size:64KiB,sweep_interval:3",
          "cache_slack:0.05, defrag_threshold:0.9 ,whole_chunk_fraction:1",
          "va_reserve:64TiB,dormant_maps:0,sweep_interval:1048576",
          "stream_cache_bytes:0,slab_size:1GiB,whole_chunk_max:128MiB",
          "small_limit:[a:b,>:c]"};
}

// One mutation of a config string: characters the grammar cares about, digits, units, random
// bytes, splices of other corpus entries, repetition, very long numbers.
std::string mutate_text(std::string s, const std::vector<std::string>& corpus,
                        std::mt19937_64& rng) {
  static const std::string alphabet = ":,[]>.-+eE0123456789 KMGTiBbx_\t\n";
  static const char* units[] = {"KiB", "MiB", "GiB",  "TiB", "KB", "GB",
                                "B",   "G",   "e308", "nan", "inf"};
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : std::size_t(rng() % n); };
  const int rounds = 1 + int(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 8) {
      case 0:
        s.insert(pick(s.size() + 1), 1, alphabet[pick(alphabet.size())]);
        break;
      case 1:
        if (!s.empty()) s.erase(pick(s.size()), 1 + pick(4));
        break;
      case 2:
        if (!s.empty()) s[pick(s.size())] = char(rng());
        break;
      case 3:
        s.insert(pick(s.size() + 1), units[pick(std::size(units))]);
        break;
      case 4: {  // splice another entry in
        const std::string& other = corpus[pick(corpus.size())];
        s.insert(pick(s.size() + 1), other.substr(pick(other.size() + 1)));
        break;
      }
      case 5:
        s.insert(pick(s.size() + 1), std::string(1 + pick(400), char('0' + rng() % 10)));
        break;
      case 6:
        if (!s.empty()) {
          const std::size_t at = pick(s.size());
          const std::string piece = s.substr(at, 1 + pick(16));
          for (int k = int(1 + rng() % 200); k > 0; --k) s.insert(at, piece);
        }
        break;
      case 7:
        s = s.substr(0, pick(s.size() + 1));
        break;
    }
  }
  return s;
}

std::string units_of(std::mt19937_64& rng) {
  static const char* units[] = {"", "B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"};
  return units[rng() % std::size(units)];
}

TEST(Fuzz, ConfigParserAcceptsOrRefusesEveryMutationWithAConfigError) {
  const std::vector<std::string> corpus = config_corpus();
  std::mt19937_64 rng(1202);
  const auto start = Clock::now();
  int done = 0, parsed = 0;
  for (; done < kIterations && Clock::now() - start < kTimeCap; ++done) {
    const std::string text = mutate_text(corpus[rng() % corpus.size()], corpus, rng);
    try {
      const Config c = Config::parse(text);
      ++parsed;
      // What parses writes back to itself.
      ASSERT_EQ(Config::parse(c.to_string()), c) << "iteration " << done << ": " << text;
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      ASSERT_FALSE(what.empty());
      ASSERT_LT(what.size(), kMaxMessage) << "iteration " << done << ": " << what.substr(0, 300);
    } catch (const std::exception& e) {
      FAIL() << "iteration " << done << ": " << typeid(e).name() << ": " << e.what() << " for \""
             << text << "\"";
    }
    // The size parser on its own, as --capacity uses it.
    const std::string size_text =
        mutate_text(std::to_string(rng() % 100000) + units_of(rng), corpus, rng);
    try {
      (void)parse_size(size_text, "--capacity");
    } catch (const ConfigError& e) {
      ASSERT_LT(std::string(e.what()).size(), kMaxMessage);
    } catch (const std::exception& e) {
      FAIL() << "iteration " << done << ": parse_size: " << typeid(e).name() << ": " << e.what();
    }
  }
  RecordProperty("iterations", done);
  RecordProperty("parsed", parsed);
  EXPECT_GE(done, kIterations / 10) << "the time cap cut the run short";
  EXPECT_GT(parsed, 0);
  EXPECT_GT(done - parsed, 0);
}

}  // namespace
