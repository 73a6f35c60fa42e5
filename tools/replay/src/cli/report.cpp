#include "cuarena/replay/report.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cuarena/config.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/replay/output.hpp"
#include "input/process.hpp"

namespace cuarena::replay {

void Notes::add(const std::string& trace, const std::string& device, const std::string& text) {
  auto [it, fresh] = index_.try_emplace({trace, text}, groups_.size());
  if (fresh) groups_.push_back({trace, text, {}});
  groups_[it->second].devices.push_back(device);
}

void Notes::flush(std::ostream& out) {
  for (const Group& g : groups_) {
    const std::vector<std::string>& d = g.devices;
    const std::string trace = clip(g.trace);  // a file's name: one line, whatever it holds
    if (d.size() <= 3) {
      for (const std::string& device : d)
        out << "cuarena replay: " << trace << (device.empty() ? "" : ":" + device) << ": " << g.text
            << '\n';
      continue;
    }
    out << "cuarena replay: " << trace << ": " << d.size() << " devices (" << d[0] << ", " << d[1]
        << ", " << d[2] << (d.size() > 4 ? ", \u2026, " : ", ") << d.back() << "): " << g.text
        << '\n';
  }
  groups_.clear();
  index_.clear();
}

namespace {

std::string count(std::uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// " with ... free ..." for the first out-of-memory: what the allocator could say of it.
std::string free_then(const Result::FirstOom& f, bool recorded) {
  if (!f.cached_free) return " (the free memory then is not known for this allocator)";
  const std::string pieces =
      count(*f.pieces, "piece", "pieces") +
      (*f.pieces > 1 ? " (the largest " + format_bytes(*f.largest_piece) + ")" : "");
  if (!f.unreserved) {
    return " with " + format_bytes(*f.cached_free) + " free in " + pieces + " inside " +
           (recorded ? "its segments (rebuilt from the trace, which does not hold the "
                       "device's own free memory)"
                     : "reserved memory (free device memory not known)");
  }
  return " with " + format_bytes(*f.cached_free + *f.unreserved) +
         " free: " + format_bytes(*f.cached_free) + " in " + pieces +
         " inside reserved memory and " + format_bytes(*f.unreserved) + " not reserved";
}

}  // namespace

std::string verdict(const Result& r) {
  const bool recorded = r.allocator == "recorded";
  if (r.ooms == 0) {
    if (!r.capacity_bytes)
      return "fits: no out-of-memory (peak reserved " + format_bytes(r.peak_reserved_bytes) + ")";
    const std::uint64_t cap = *r.capacity_bytes;
    if (r.peak_reserved_bytes <= cap)
      return "fits with " + format_bytes(cap - r.peak_reserved_bytes) + " to spare";
    return "held " + format_bytes(r.peak_reserved_bytes) + " at its peak when recorded, " +
           format_bytes(r.peak_reserved_bytes - cap) +
           " more than the capacity (a recording, not replayed under the limit)";
  }
  std::string v = recorded ? "ran out of memory when recorded" : "runs out of memory";
  if (!r.first_oom)
    return v + ": " + count(r.ooms, "failed allocation", "failed allocations") +
           " (where is not known for this allocator)";
  const Result::FirstOom& f = *r.first_oom;
  v += " at event " + std::to_string(f.event) + ": a " + format_bytes(f.request) + " request" +
       free_then(f, recorded);
  if (r.ooms > 1) v += "; " + std::to_string(r.ooms) + " failed allocations in all";
  return v;
}

void print_verdicts(std::ostream& out, const std::vector<Result>& results) {
  for (const Result& r : results) {
    if (r.verdict.empty()) continue;
    out << r.trace << ' ' << r.allocator << (r.backend == "trace" ? "" : " on " + r.backend) << ": "
        << r.verdict << '\n';
  }
}

void print_table(std::ostream& out, const std::vector<Result>& results) {
  bool any_min = false;
  for (const Result& r : results) any_min = any_min || r.min_capacity_bytes.has_value();
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"trace",          "allocator",     "backend",
                                   "peak requested", "peak reserved", "ratio"};
  if (any_min) head.push_back("min capacity");
  bool any_latency = false;
  for (const Result& r : results) any_latency = any_latency || r.latency_us.has_value();
  for (const char* h : {"ext.frag", "OOMs", "allocs", "skipped", "time s"}) head.push_back(h);
  if (any_latency) {
    for (const char* h : {"alloc p50 us", "alloc p99 us", "free p50 us", "free p99 us"})
      head.push_back(h);
  }
  rows.push_back(head);
  auto fixed = [](double v, int digits) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(digits) << v;
    return s.str();
  };
  for (const Result& r : results) {
    std::vector<std::string> row = {r.trace,
                                    r.allocator,
                                    r.backend,
                                    format_bytes(r.peak_requested_bytes),
                                    format_bytes(r.peak_reserved_bytes),
                                    fixed(r.reserved_ratio, 4)};
    if (any_min) row.push_back(r.min_capacity_bytes ? format_bytes(*r.min_capacity_bytes) : "-");
    row.push_back(fixed(r.external_fragmentation, 3));
    row.push_back(std::to_string(r.ooms));
    row.push_back(std::to_string(r.allocs));
    row.push_back(std::to_string(r.skipped_events));
    row.push_back(fixed(r.elapsed_s, 3));
    if (any_latency) {
      for (double v : r.latency_us
                          ? std::vector<double>{r.latency_us->alloc_p50, r.latency_us->alloc_p99,
                                                r.latency_us->free_p50, r.latency_us->free_p99}
                          : std::vector<double>(4, -1.0))
        row.push_back(v < 0 ? "-" : fixed(v, 2));
    }
    rows.push_back(row);
  }
  std::vector<std::size_t> width(head.size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      const bool left = c < 3;
      out << (c ? "  " : "") << (left ? std::left : std::right) << std::setw(int(width[c]))
          << rows[i][c];
    }
    out << '\n';
    if (i == 0) {
      std::size_t total = 0;
      for (std::size_t w : width) total += w + 2;
      out << std::string(total - 2, '-') << '\n';
    }
  }
}

std::string json_text(const std::vector<Result>& results, bool series) {
  nlohmann::json doc;
  doc["results"] = nlohmann::json::array();
  for (const Result& r : results) {
    nlohmann::json j = {{"trace", r.trace},
                        {"allocator", r.allocator},
                        {"backend", r.backend},
                        {"device", r.device},
                        {"peak_requested_bytes", r.peak_requested_bytes},
                        {"peak_reserved_bytes", r.peak_reserved_bytes},
                        {"reserved_ratio", r.reserved_ratio},
                        {"external_fragmentation", r.external_fragmentation},
                        {"free_at_peak_bytes", r.free_at_peak_bytes},
                        {"rounding_waste_bytes", r.rounding_waste_bytes},
                        {"ooms", r.ooms},
                        {"allocs", r.allocs},
                        {"frees", r.frees},
                        {"skipped_events", r.skipped_events},
                        {"elapsed_s", r.elapsed_s}};
    if (r.min_capacity_bytes) j["min_capacity_bytes"] = *r.min_capacity_bytes;
    if (r.min_capacity_search_bytes) j["min_capacity_search_bytes"] = *r.min_capacity_search_bytes;
    if (!r.min_capacity_probes.empty()) {
      j["min_capacity_probes"] = nlohmann::json::array();
      for (const CapacityProbe& p : r.min_capacity_probes)
        j["min_capacity_probes"].push_back(
            {{"capacity_bytes", p.capacity_bytes}, {"ooms", p.ooms}});
    }
    if (r.latency_us) {
      const auto& l = *r.latency_us;
      j["alloc_us"] = {{"p50", l.alloc_p50}, {"p99", l.alloc_p99}, {"max", l.alloc_max}};
      j["free_us"] = {{"p50", l.free_p50}, {"p99", l.free_p99}, {"max", l.free_max}};
    }
    if (!r.counters.empty()) j["counters"] = r.counters;
    if (r.capacity_bytes) j["capacity_bytes"] = *r.capacity_bytes;
    if (r.first_oom) {
      const Result::FirstOom& f = *r.first_oom;
      nlohmann::json o = {{"event", f.event}, {"request_bytes", f.request}};
      if (f.cached_free) o["cached_free_bytes"] = *f.cached_free;
      if (f.pieces) o["free_pieces"] = *f.pieces;
      if (f.largest_piece) o["largest_free_piece_bytes"] = *f.largest_piece;
      if (f.unreserved) o["unreserved_bytes"] = *f.unreserved;
      j["first_oom"] = o;
    }
    if (!r.verdict.empty()) j["verdict"] = r.verdict;
    if (series && r.series) {
      const Series& t = *r.series;
      j["series"] = {{"window", t.window},
                     {"event", t.event},
                     {"reserved_bytes", t.reserved},
                     {"requested_bytes", t.requested}};
      if (!t.time_us.empty()) j["series"]["time_us"] = t.time_us;
    }
    doc["results"].push_back(j);
  }
  return doc.dump(2) + '\n';
}

void write_json(const std::string& path, const std::vector<Result>& results, bool series,
                const std::string& what) {
  write_output(path, what, json_text(results, series));
}

std::vector<Result> read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw TraceError(path + ": cannot open");
  std::vector<Result> out;
  try {
    const nlohmann::json doc = nlohmann::json::parse(in);
    for (const auto& j : doc.at("results")) {
      Result r;
      r.trace = j.at("trace");
      r.allocator = j.at("allocator");
      r.backend = j.at("backend");
      r.device = j.value("device", 0);
      r.peak_requested_bytes = j.at("peak_requested_bytes");
      r.peak_reserved_bytes = j.at("peak_reserved_bytes");
      r.reserved_ratio = j.at("reserved_ratio");
      r.external_fragmentation = j.value("external_fragmentation", 0.0);
      r.free_at_peak_bytes = j.value("free_at_peak_bytes", std::uint64_t{0});
      r.rounding_waste_bytes = j.value("rounding_waste_bytes", std::uint64_t{0});
      r.ooms = j.at("ooms");
      r.allocs = j.at("allocs");
      r.frees = j.at("frees");
      r.skipped_events = j.at("skipped_events");
      r.elapsed_s = j.at("elapsed_s");
      if (j.contains("min_capacity_bytes")) r.min_capacity_bytes = j["min_capacity_bytes"];
      if (j.contains("min_capacity_search_bytes"))
        r.min_capacity_search_bytes = j["min_capacity_search_bytes"];
      for (const auto& p : j.value("min_capacity_probes", nlohmann::json::array()))
        r.min_capacity_probes.push_back({p.at("capacity_bytes"), p.at("ooms")});
      if (j.contains("alloc_us")) {
        const auto& a = j["alloc_us"];
        const auto& f = j["free_us"];
        r.latency_us = Result::Latency{a["p50"], a["p99"], a["max"], f["p50"], f["p99"], f["max"]};
      }
      if (j.contains("counters"))
        r.counters = j["counters"].get<std::map<std::string, std::int64_t>>();
      if (j.contains("capacity_bytes")) r.capacity_bytes = j["capacity_bytes"];
      if (j.contains("first_oom")) {
        const auto& o = j["first_oom"];
        Result::FirstOom f;
        f.event = o.at("event");
        f.request = o.at("request_bytes");
        auto opt = [&o](const char* key, std::optional<std::uint64_t>& to) {
          if (o.contains(key)) to = o[key].get<std::uint64_t>();
        };
        opt("cached_free_bytes", f.cached_free);
        opt("free_pieces", f.pieces);
        opt("largest_free_piece_bytes", f.largest_piece);
        opt("unreserved_bytes", f.unreserved);
        r.first_oom = f;
      }
      r.verdict = j.value("verdict", std::string());
      if (j.contains("series")) {
        const auto& t = j["series"];
        Series series;
        series.window = t.at("window");
        series.event = t.at("event").get<std::vector<std::uint64_t>>();
        series.reserved = t.at("reserved_bytes").get<std::vector<std::uint64_t>>();
        series.requested = t.at("requested_bytes").get<std::vector<std::uint64_t>>();
        if (t.contains("time_us")) series.time_us = t["time_us"].get<std::vector<std::int64_t>>();
        r.series = std::move(series);
      }
      out.push_back(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    throw TraceError(path + ": not a cuarena results file (" + e.what() + ")");
  }
  return out;
}

namespace {

std::string report_script() {
  return script_path("CUARENA_REPORT_SCRIPT", "report.py", CUARENA_REPORT_SCRIPT);
}

// Runs the report script with `args`; "" when it succeeded, else its message: the last line
// it wrote to stderr (it prints one, "cuarena-report: ...", for every failure it foresees),
// clipped, or its exit status.
std::string run_report_script(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {python_executable(), report_script()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string err;
  int rc = 0;
  try {
    rc = run_process(argv, {}, err);
  } catch (const std::runtime_error& e) {
    return std::string("cannot run the report script: ") + e.what();
  }
  if (rc == 0) return "";
  while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
  const std::size_t nl = err.rfind('\n');
  std::string line = clip(nl == std::string::npos ? err : err.substr(nl + 1), 400);
  const std::string prefix = "cuarena-report: ";
  if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  return "the report script " + report_script() + " failed (exit " + std::to_string(rc) + ")" +
         (line.empty() ? "" : ": " + line);
}

}  // namespace

void check_json(const std::string& path) {
  check_output(path, "--json", "results.json", /*direct_ok=*/true);
}

void check_report(const std::string& path) {
  const std::filesystem::path p(path);
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (ext != ".html" && ext != ".png")
    throw ConfigError("--report " + clip(path) +
                      ": give a file name ending in .html (the plot beside the table) or .png "
                      "(the plot alone)");
  // Not a device: the script writes a file of its own beside the one it is given.
  check_output(path, "--report", "report.html", /*direct_ok=*/false);
  const std::string why = run_report_script({"--check"});
  if (!why.empty()) throw ConfigError("--report " + clip(path) + ": " + why);
}

void write_report(const std::string& path, const std::vector<Result>& results) {
  // The rows' JSON for the script, in a scratch file removed on every way out.
  char scratch[] = "/tmp/cuarena-report-XXXXXX";
  const int fd = mkostemp(scratch, O_CLOEXEC);
  if (fd < 0)
    throw TraceError("--report " + clip(path) +
                     ": cannot create a temporary file in /tmp: " + std::strerror(errno));
  struct Remove {
    const char* file;
    ~Remove() { std::remove(file); }
  } remove_scratch{scratch};
  const bool written = write_all(fd, json_text(results, true));
  const int err = errno;
  if (::close(fd) != 0 || !written)
    throw TraceError("--report " + clip(path) + ": cannot write a temporary file in /tmp: " +
                     std::strerror(written ? errno : err));
  write_output(path, "--report", [&](const std::string& file, int) {
    if (file == path) throw TraceError("not a regular file");
    const std::string why = run_report_script({scratch, file});
    if (!why.empty()) throw TraceError(why);
  });
}

}  // namespace cuarena::replay
