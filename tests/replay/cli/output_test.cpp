// The replayer's outputs (output.hpp): written whole or not at all, beside the target under a
// name of their own; and its error lines, clipped and escaped (clip(), error_line()).
#include "cuarena/replay/output.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/replay/trace.hpp"

namespace fs = std::filesystem;
using namespace cuarena;
using namespace cuarena::replay;

namespace {

// A directory of its own for each test, removed after it.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string name = (fs::temp_directory_path() / "cuarena-output-test-XXXXXX").string();
    path = ::mkdtemp(name.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// What write_output() threw, "" when nothing.
std::string failure(const std::string& path,
                    const std::function<void(const std::string&, int)>& fill) {
  try {
    write_output(path, "--out", fill);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Clip, EscapesControlCharactersAndCutsLongText) {
  EXPECT_EQ(clip("plain text"), "plain text");
  EXPECT_EQ(clip("a\nb\rc\td\x1b[31m\x7f"), "a\\nb\\rc\\td\\x1b[31m\\x7f");
  EXPECT_EQ(clip("caf\xc3\xa9 \xc2\x9b"), "caf\xc3\xa9 \\u009b");  // é kept; C1 CSI escaped
  const std::string cut = clip(std::string(300, 'x'));
  EXPECT_EQ(cut, std::string(200, 'x') + "\u2026 (300 characters)");
  // Never inside a UTF-8 sequence: 199 bytes, then a two-byte é that does not fit whole.
  EXPECT_EQ(clip(std::string(199, 'x') + "\xc3\xa9" + std::string(50, 'y')),
            std::string(199, 'x') + "\u2026 (251 characters)");
  // Escapes count toward the limit: 1000 newlines stay short.
  EXPECT_LT(clip(std::string(1000, '\n')).size(), 230u);
}

TEST(ErrorLine, QuotesOfLongArgumentsAreClippedAndTheLineIsOneLine) {
  const std::string big(100000, 'v');
  const std::string line = error_line("--opt " + big + ": bad; again " + big, {"--opt", big});
  EXPECT_EQ(line, "--opt " + clip(big) + ": bad; again " + clip(big));
  // --opt=value: the value alone is what a message quotes.
  EXPECT_EQ(error_line("bad value " + big, {"--opt=" + big}), "bad value " + clip(big));
  EXPECT_EQ(error_line("a\nb"), "a\\nb");
  EXPECT_LT(error_line(std::string(100000, 'm')).size(), 2100u);
}

TEST(WriteOutput, ReplacesTheFileWholeWithItsModeAndLeavesNothingBeside) {
  TempDir dir;
  const std::string path = dir.file("results.json");
  put(path, "old");
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  write_output(path, "--out", std::string_view("new"));
  EXPECT_EQ(read(path), "new");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(dir.names(), std::vector<std::string>{"results.json"});
}

TEST(WriteOutput, AFailureLeavesTheEarlierFileAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("out.cuat");
  put(path, "earlier");
  put(path + ".partial", "the user's own");  // a name a fixed temporary would take
  std::string seen;
  const std::string why = failure(path, [&](const std::string& file, int fd) {
    seen = file;
    ASSERT_EQ(::write(fd, "half", 4), 4);
    throw TraceError(file + ": write failed: No space left on device (in " + file + ")");
  });
  // One line: the option, the target (never the temporary), the system's reason.
  EXPECT_EQ(why, "--out " + path + ": write failed: No space left on device (in " + path +
                     "); the earlier file is unchanged");
  EXPECT_NE(seen, path);
  EXPECT_EQ(fs::path(seen).parent_path(), dir.path);  // beside it, for the rename
  EXPECT_EQ(fs::path(seen).extension(), ".cuat");     // the report script picks the format by it
  EXPECT_EQ(read(path), "earlier");
  EXPECT_EQ(read(path + ".partial"), "the user's own");
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"out.cuat", "out.cuat.partial"}));
}

TEST(WriteOutput, TwoWritesBesideOneTargetTakeTwoNames) {
  TempDir dir;
  const std::string path = dir.file("r.png");
  std::string first, second;
  write_output(path, "--out", [&](const std::string& file, int) {
    first = file;
    write_output(path, "--out", [&](const std::string& inner, int) { second = inner; });
  });
  EXPECT_NE(first, second);
  EXPECT_EQ(dir.names(), std::vector<std::string>{"r.png"});
}

TEST(WriteOutput, ALinkIsFollowedNotReplaced) {
  TempDir dir;
  const std::string real = dir.file("real.json"), link = dir.file("link.json");
  put(real, "old");
  fs::create_symlink(real, link);
  write_output(link, "--out", std::string_view("new"));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read(real), "new");
}

TEST(WriteOutput, ADeviceIsWrittenDirectlyAndItsErrorNamed) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string why = failure("/dev/full", [](const std::string& file, int fd) {
    EXPECT_EQ(file, "/dev/full");
    if (!write_all(fd, std::string(1 << 16, 'x')))
      throw TraceError(std::string("write failed: ") + std::strerror(errno));
  });
  EXPECT_EQ(why, "--out /dev/full: write failed: No space left on device");
}

TEST(WriteOutput, ADirectoryThatCannotTakeTheTemporaryIsNamed) {
  TempDir dir;
  const std::string why = failure(dir.file("missing/out.json"), [](const std::string&, int) {});
  EXPECT_EQ(why, "--out " + dir.file("missing/out.json") + ": cannot create a temporary file in " +
                     dir.file("missing") + ": No such file or directory");
}

TEST(CheckOutput, RefusesWhatCannotBeWrittenBeforeAnyReplay) {
  TempDir dir;
  auto refusal = [](const std::string& path, bool direct_ok) -> std::string {
    try {
      check_output(path, "--out", "r.json", direct_ok);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal(dir.file("new.json"), false), "");
  EXPECT_NE(refusal(dir.path.string(), false).find("is a directory; give a file name such as"),
            std::string::npos);
  EXPECT_NE(refusal(dir.file("no/x.json"), false).find("cannot write in"), std::string::npos);
  EXPECT_NE(refusal(dir.file(std::string(300, 'n')), false).find("File name too long"),
            std::string::npos);
  if (fs::exists("/dev/null")) {
    EXPECT_EQ(refusal("/dev/null", true), "");
    EXPECT_NE(refusal("/dev/null", false).find("not a regular file"), std::string::npos);
  }
}
