// The files the replayer writes (--json, --report, convert's OUT), each whole or not at all, and
// its error lines.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cuarena::replay {

/// Replaces the file `path` with one that `fill` writes, whole or not at all.
///
/// `fill(file, fd)` writes `file`, a new empty file beside `path` with a name of its own
/// (`.NAME.XXXXXX.EXT`, made by mkstemp: no existing file is touched), through `fd` (open for
/// writing) or by name (`fd` then unused; it may even replace `file`, by rename). It throws
/// TraceError saying what failed; a message quoting `file` is shown quoting `path`. The file is
/// then synced to disk, given the mode of the `path` it replaces (a new one: 0666 less the
/// umask) and renamed over `path`. A symbolic link is followed: the file it names is replaced.
///
/// An existing `path` that is not a regular file (a device such as /dev/stdout, a pipe) cannot
/// be replaced: `fill(path, fd)` writes it directly.
///
/// On any failure the earlier `path` is left as it was, the temporary is removed, and a
/// TraceError is thrown, one line: "`what` PATH: PROBLEM" (PATH clipped), the problem with the
/// system's reason: "--json out.json: write failed: No space left on device; the earlier file
/// is unchanged".
void write_output(const std::string& path, const std::string& what,
                  const std::function<void(const std::string& file, int fd)>& fill);

/// write_output() of `data`.
void write_output(const std::string& path, const std::string& what, std::string_view data);

/// Writes all of `data` to `fd`, retrying short writes; false (errno set) when a write fails.
bool write_all(int fd, std::string_view data);

/// Checks, before any replay, that write_output() can write `path` (`what`: the option, as in its
/// errors): not a directory (the error suggests `path`/`example` instead), a file name, its
/// directory writable (for the temporary and the rename) and, when it exists, the file itself
/// writable; an existing `path` that is not a regular file is refused unless `direct_ok`. Creates
/// nothing. Throws ConfigError.
void check_output(const std::string& path, const std::string& what, const std::string& example,
                  bool direct_ok);

/// `message` as one line of bounded length for stderr: each of `inputs` (the user's arguments,
/// `--opt=value` counting as its value too) that it quotes whole is shown clipped, then the line
/// is clip()ped (control characters escaped; at most about 2000 bytes). For the messages of
/// code that quotes an argument unclipped (the command-line parser, the trace reader).
std::string error_line(std::string message, const std::vector<std::string>& inputs = {});

}  // namespace cuarena::replay
