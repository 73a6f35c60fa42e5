#include "cuarena/replay/output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/replay/trace.hpp"

namespace cuarena::replay {

namespace fs = std::filesystem;

namespace {

std::string os_error(int err) { return std::strerror(err); }

// The directory a file is written in ("." for a bare name).
fs::path directory_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : "."; }

// Every `from` in `text` replaced by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (std::size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size())
    text.replace(at, from.size(), to);
  return text;
}

// The mode a new file gets from open(): 0666 less the umask (which can only be read by setting).
mode_t new_file_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

}  // namespace

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data.remove_prefix(std::size_t(n));
  }
  return true;
}

void write_output(const std::string& path, const std::string& what,
                  const std::function<void(const std::string& file, int fd)>& fill) {
  const std::string shown = what + " " + clip(path);
  std::error_code ec;
  fs::path target(path);
  // Follow a link: replacing it by a file would cut it from what it names.
  if (fs::is_symlink(target, ec)) {
    const fs::path real = fs::canonical(target, ec);
    if (!ec) target = real;
  }
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  // What `fill` threw, as a problem of `path`: the file it wrote is this function's business.
  auto problem = [&](const std::exception& e, const std::string& file) {
    std::string why = replace_all(e.what(), file, target.string());
    if (why.rfind(target.string() + ": ", 0) == 0) why.erase(0, target.string().size() + 2);
    return clip(why, 1000);
  };

  if (exists && !S_ISREG(st.st_mode)) {  // a device or a pipe: no rename, no temporary
    const int fd = ::open(target.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) throw TraceError(shown + ": cannot open it for writing: " + os_error(errno));
    try {
      fill(target.string(), fd);
    } catch (const std::exception& e) {
      ::close(fd);
      throw TraceError(shown + ": " + problem(e, target.string()));
    }
    if (::close(fd) != 0) throw TraceError(shown + ": write failed: " + os_error(errno));
    return;
  }

  // A hidden name with the target's extension (the report script picks the format by it),
  // made unique by mkstemp; the stem is cut so that the name stays within NAME_MAX.
  const std::string stem = target.stem().string().substr(0, 100);
  const std::string ext = target.extension().string().substr(0, 20);
  std::string tmp = (directory_of(target) / ("." + stem + ".XXXXXX" + ext)).string();
  const int fd = ::mkostemps(tmp.data(), int(ext.size()), O_CLOEXEC);
  if (fd < 0)
    throw TraceError(shown + ": cannot create a temporary file in " +
                     clip(directory_of(target).string()) + ": " + os_error(errno));
  const std::string unchanged = exists ? "; the earlier file is unchanged" : "";
  auto fail = [&](const std::string& problem) {
    std::remove(tmp.c_str());
    throw TraceError(shown + ": " + problem + unchanged);
  };
  try {
    fill(tmp, fd);
  } catch (const std::exception& e) {
    ::close(fd);
    fail(problem(e, tmp));
  } catch (...) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) fail("write failed: " + os_error(errno));
  // Synced before the rename, so that a crash cannot leave a renamed but empty file. `fill` may
  // have replaced the temporary by name: open it again rather than trust `fd`.
  const int sync_fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (sync_fd < 0 || ::fsync(sync_fd) != 0) {
    const int err = errno;
    if (sync_fd >= 0) ::close(sync_fd);
    fail("write failed: " + os_error(err));
  }
  ::close(sync_fd);
  if (::chmod(tmp.c_str(), exists ? (st.st_mode & 07777) : new_file_mode()) != 0)
    fail("cannot set the new file's permissions: " + os_error(errno));
  if (std::rename(tmp.c_str(), target.c_str()) != 0)
    fail("cannot rename the new file into place: " + os_error(errno));
}

void write_output(const std::string& path, const std::string& what, std::string_view data) {
  write_output(path, what, [&](const std::string&, int fd) {
    if (!write_all(fd, data)) throw TraceError("write failed: " + os_error(errno));
  });
}

void check_output(const std::string& path, const std::string& what, const std::string& example,
                  bool direct_ok) {
  const std::string shown = what + " " + clip(path);
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec))
    throw ConfigError(shown + " is a directory; give a file name such as " +
                      clip((p / example).string()));
  if (!p.has_filename()) throw ConfigError(shown + ": give a file name, not a directory");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode) && !direct_ok)
      throw ConfigError(shown + ": not a regular file; give the name of a file to write");
    if (::access(path.c_str(), W_OK) != 0)
      throw ConfigError(shown + ": cannot write it: " + os_error(errno));
    if (!S_ISREG(st.st_mode)) return;  // written directly: its directory does not matter
  } else if (errno != ENOENT) {  // a name too long, a loop of links, ...: found now, not after
    throw ConfigError(shown + ": cannot write it: " + os_error(errno));
  }
  // The temporary and the rename need the directory (of the file a link names).
  const fs::path real = fs::is_symlink(p, ec) ? fs::weakly_canonical(p, ec) : p;
  const std::string dir = directory_of(real).string();
  if (::access(dir.c_str(), W_OK) != 0)
    throw ConfigError(shown + ": cannot write in " + clip(dir) + ": " + os_error(errno));
}

std::string error_line(std::string message, const std::vector<std::string>& inputs) {
  constexpr std::size_t kQuote = 200;  // clip()'s default
  for (const std::string& input : inputs) {
    std::vector<std::string> forms = {input};
    if (input.rfind("--", 0) == 0 && input.find('=') != std::string::npos)
      forms.push_back(input.substr(input.find('=') + 1));  // --opt=value
    for (const std::string& form : forms)
      if (form.size() > kQuote) message = replace_all(message, form, clip(form, kQuote));
  }
  return clip(message, 2000);
}

}  // namespace cuarena::replay
