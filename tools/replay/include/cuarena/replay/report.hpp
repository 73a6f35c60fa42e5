// Output of `cuarena replay`: a table for people, JSON for programs.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "cuarena/replay/replay.hpp"

namespace cuarena::replay {

/// Notes for stderr, "cuarena replay: NAME: TEXT", grouped so that a trace with many devices
/// gets one line per text, not one per device: the same text for more than three devices of a
/// trace is written once, "TRACE: N devices (cuda0, cuda1, cuda2, …, cuda9): TEXT".
class Notes {
 public:
  /// `device` is "" for a trace replayed as one device, else its label ("cuda3").
  void add(const std::string& trace, const std::string& device, const std::string& text);
  /// Writes the notes held, each text where it first came, and forgets them.
  void flush(std::ostream& out);

 private:
  struct Group {
    std::string trace, text;
    std::vector<std::string> devices;
  };
  std::vector<Group> groups_;
  std::map<std::pair<std::string, std::string>, std::size_t> index_;  // (trace, text) -> group
};

/// The row's verdict for people (Result::verdict): "fits with 1.20 GiB to spare" (capacity
/// minus peak reserved), or "runs out of memory at event 10432: a 1.80 GiB request with
/// 3.10 GiB free: ..." (the first failure and, where the allocator can say, the free memory
/// then and in how many pieces). A `recorded` row speaks of the recording ("ran out of memory
/// when recorded", or "held ... more than the capacity", as it is not replayed under a limit).
std::string verdict(const Result& r);

/// Writes "TRACE ALLOCATOR [on BACKEND]: VERDICT" for each row with a verdict.
void print_verdicts(std::ostream& out, const std::vector<Result>& results);

/// Writes the results as an aligned text table.
void print_table(std::ostream& out, const std::vector<Result>& results);

/// {"results": [...]}, with each row's "series" when `series` (and the row has one).
std::string json_text(const std::vector<Result>& results, bool series = false);

/// Writes json_text() to `path`, whole or not at all (write_output(), whose errors name it as
/// `what`). Throws TraceError when it cannot be written.
void write_json(const std::string& path, const std::vector<Result>& results, bool series = false,
                const std::string& what = "--json");

/// Reads what write_json() wrote. Throws TraceError.
std::vector<Result> read_json(const std::string& path);

/// --json PATH: checks, before any replay, that PATH can be written (check_output(); a device
/// such as /dev/stdout is written directly), without creating it (a run that fails leaves no
/// empty results file). Throws ConfigError.
void check_json(const std::string& path);

/// --report PATH: checks, before any replay, that PATH ends in .html or .png, can be written
/// (check_output(); a regular file or a new one), and that the report script's Python has
/// matplotlib. Throws ConfigError naming the problem (for a missing module: which, and how to
/// install it).
void check_report(const std::string& path);

/// Draws reserved (one line per row) and requested bytes over the replay, each peak marked, as
/// a PNG at `path`, or for .html a page with that picture beside the rows' table
/// (tools/replay/report.py, given the rows' JSON with their series, writing write_output()'s
/// temporary). Rows without a series are in the table only. A failed write leaves the earlier
/// file as it was. Throws TraceError naming the problem.
void write_report(const std::string& path, const std::vector<Result>& results);

}  // namespace cuarena::replay
