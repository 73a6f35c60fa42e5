// SimBackend: a simulated device for CPU-only replay and tests.
//
// It does address arithmetic only (no memory behind the addresses), counts physical bytes
// exactly, enforces a capacity on them, and models stream completion with a logical clock: an
// event recorded at tick t completes once the clock reaches t + event_latency. The replayer
// advances the clock one tick per trace event; wait_event() jumps it forward (the host waited).
// A stream told of its work (queue_work) is behind by its own work only: its event completes
// event_latency ticks after the stream's last work, so a stream gone idle catches up, as a real
// one does (no sooner than one tick after the record while event_latency >= 1).
// Deterministic: the same calls give the same addresses and answers on every run.
//
// A stream made to wait for another's event (stream_wait_event) completes its later events no
// sooner than that one, and remembers up to which tick of the other stream it is ordered behind
// (waited_for(): the tests' check that no byte is reused across streams too early).
//
// A stream can be held (hold_stream): events recorded on it while held stay incomplete, whatever
// the clock says, until release_stream(); the replayer holds a stream that stands for another
// stream's use of a block (record_stream) until the trace says that use ended.
//
// With `segments` set it models a segment upstream (cudaMalloc, cudaMallocAsync) instead:
// supports_mapping() is false, memory comes only from allocate_segment(), and the mapping calls
// are misuse.
//
// A stream can be marked captured (begin_capture): stream_capturing() then answers true, and
// recording an event on it or making it wait for one is misuse (the core must do neither).
//
// It also checks its caller: mapping over a mapped granule, unmapping an unmapped one, releasing
// a chunk still mapped, mapping or unmapping part of a whole chunk, granting access to a range
// not wholly mapped or cutting through a mapping, or using an unknown event throws
// std::logic_error, so a policy bug cannot pass silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cuarena/config_table.hpp"
#include "cuarena/device_backend.hpp"

namespace cuarena {

/// The simulator's keys of a config string (sim_event_latency, sim_capacity, sim_granularity),
/// kept out of the core's Config: the replayer's --config reads them next to the core's keys
/// (parse_config with both tables).
struct SimConfig {
  std::uint64_t event_latency = 1;                 ///< ticks until an event completes
  std::size_t capacity = 0;                        ///< device bytes; 0: Options' default
  std::size_t granularity = std::size_t{2} << 20;  ///< granule bytes

  static const ConfigTable<SimConfig>& table();
  /// Throws ConfigError when the keys disagree (a sim_capacity below one sim_granularity
  /// granule): the table reads each key alone, in the string's order.
  void check() const;
  bool operator==(const SimConfig&) const = default;
};

class SimBackend final : public DeviceBackend {
 public:
  /// The recorded H200's memory: the simulated device's capacity unless told otherwise.
  static constexpr std::size_t kDefaultCapacity = std::size_t{143771} << 20;

  struct Options {
    std::size_t capacity = kDefaultCapacity;         ///< bytes
    std::size_t granularity = std::size_t{2} << 20;  ///< bytes, a power of two
    std::uint64_t event_latency = 1;                 ///< ticks until an event completes
    bool segments = false;  ///< model a segment upstream (no mapping) instead of VMM
  };
  explicit SimBackend(Options options);
  SimBackend() : SimBackend(Options{}) {}

  std::size_t granularity() const override { return options_.granularity; }
  std::size_t capacity() const override { return options_.capacity; }
  DevicePtr reserve_address(std::size_t bytes) override;
  void release_address(DevicePtr va, std::size_t bytes) override;
  PhysHandle create_physical(std::size_t bytes) override;
  PhysHandle create_whole_physical(std::size_t bytes) override;
  void release_physical(PhysHandle chunk) override;
  void map(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) override;
  void map_no_access(DevicePtr va, std::size_t bytes, PhysHandle chunk,
                     std::size_t offset) override;
  void set_access(DevicePtr va, std::size_t bytes) override;
  void unmap(DevicePtr va, std::size_t bytes) override;
  EventId record_event(StreamId stream) override;
  bool event_completed(EventId event) override;
  void wait_event(EventId event) override;
  void release_event(EventId event) override;
  bool supports_stream_waits() const override { return true; }
  /// Always true: an event of a held stream keeps the waiting stream's later events incomplete
  /// until that stream's release too.
  bool stream_wait_event(StreamId stream, EventId event) override;
  bool stream_capturing(StreamId stream) override { return captured_.count(stream) != 0; }
  bool supports_mapping() const override { return !options_.segments; }
  DevicePtr allocate_segment(std::size_t bytes, StreamId stream) override;
  void free_segment(DevicePtr ptr, std::size_t bytes) override;
  void trim() override { ++trims_; }
  std::size_t trims() const { return trims_; }

  /// Holds `stream`: events recorded on it from now until release_stream(stream) do not
  /// complete (event_completed() is false) before that release, however far the clock runs.
  /// wait_event() on such an event completes it (the host waited for the stream's work) and
  /// moves the clock as for any event. Holding a held stream changes nothing.
  void hold_stream(StreamId stream);
  /// Releases a held stream: the events it held are complete at once (the stream's work is
  /// done), but no sooner than what their stream had been made to wait for; its later events
  /// complete as any event does (event_latency ticks after they are recorded). Releasing a stream
  /// not held changes nothing.
  void release_stream(StreamId stream);

  /// Marks `stream` as captured into a graph until end_capture(stream): from then on an event
  /// recorded on it, or a wait made on it, throws std::logic_error.
  void begin_capture(StreamId stream) { captured_.insert(stream); }
  void end_capture(StreamId stream) { captured_.erase(stream); }

  /// Advances the device clock by `ticks`.
  void advance(std::uint64_t ticks = 1) { now_ += ticks; }
  /// `stream` was given device work at the current tick (the replayer: a trace event on it).
  /// From then on its events complete event_latency ticks after its latest work, and no sooner
  /// than min(event_latency, 1) ticks after they are recorded. A stream never told of work keeps
  /// the plain rule (event_latency ticks after the record).
  void queue_work(StreamId stream) { last_work_[stream] = now_; }
  std::uint64_t now() const { return now_; }
  /// True when work submitted to `stream` from now on runs after all work submitted to `other`
  /// up to tick `tick`: `stream` was made to wait for an event recorded on `other` at or after it,
  /// or on an event of a stream that had been made to wait so (transitively).
  bool waited_for(StreamId stream, StreamId other, std::uint64_t tick) const;

  /// Physical memory created and not released, in bytes, and its peak.
  std::size_t physical_bytes() const { return physical_bytes_; }
  std::size_t peak_physical_bytes() const { return peak_physical_bytes_; }
  /// True when every granule overlapping [addr, addr+bytes) is mapped and accessible.
  bool is_mapped(DevicePtr addr, std::size_t bytes) const;
  /// The physical memory behind the byte at `addr`: its chunk (0 when unmapped) and the byte's
  /// offset in that chunk. Lets tests check that live blocks never share physical bytes.
  struct Backing {
    PhysHandle chunk = 0;
    std::size_t offset = 0;
  };
  Backing backing(DevicePtr addr) const;
  std::size_t map_calls() const { return map_calls_; }
  std::size_t unmap_calls() const { return unmap_calls_; }
  std::size_t set_access_calls() const { return set_access_calls_; }
  std::size_t live_events() const { return events_.size(); }
  std::size_t live_chunks() const { return chunks_.size(); }
  /// Live chunks made by create_whole_physical().
  std::size_t live_whole_chunks() const;

 private:
  struct Range {
    DevicePtr base;
    std::size_t size;
    // Per granule up to the highest ever mapped (not the whole reservation, which may be 4x
    // the device: memory follows what is mapped, as in the core's Arena).
    std::vector<PhysHandle> mapped;   // the chunk mapped there, 0 if none
    std::vector<std::size_t> offset;  // its byte offset in that chunk
    std::vector<bool> access;         // mapped with access granted
    bool segment = false;             // from allocate_segment(): backed by its own chunk
  };
  struct Chunk {
    std::size_t bytes;
    std::size_t mappings = 0;  // granule mappings of this chunk, over all addresses
    bool whole = false;        // mapped and unmapped only as a whole
  };
  Range& range_of(DevicePtr va, std::size_t bytes, const char* op);
  static void grow(Range& r, std::size_t granules);
  void map_granules(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset,
                    bool access);
  /// True when granules i and i+1 of `r` are one mapping (consecutive granules of a whole chunk).
  bool one_mapping(const Range& r, std::size_t i) const;
  struct Span {
    Range& r;
    std::size_t first, count;  ///< granules of r
  };
  /// The granules behind [va, va+bytes) for `op` (unmap, set_access), which must all be mapped
  /// and cut no whole chunk's mapping; misuse otherwise.
  Span whole_mappings(DevicePtr va, std::size_t bytes, const char* op);
  DevicePtr reserve(std::size_t bytes);
  void require_mapping(const char* op) const;
  const Range* find_range(DevicePtr va) const;

  Options options_;
  std::vector<Range> ranges_;
  DevicePtr next_va_;
  std::unordered_map<PhysHandle, Chunk> chunks_;
  PhysHandle next_chunk_ = 1;
  std::size_t physical_bytes_ = 0;
  std::size_t peak_physical_bytes_ = 0;
  std::size_t map_calls_ = 0;
  std::size_t unmap_calls_ = 0;
  std::size_t set_access_calls_ = 0;
  std::size_t trims_ = 0;
  std::uint64_t now_ = 0;
  EventId next_event_ = 1;
  struct Event {
    std::uint64_t completes = 0;  // the tick it completes at (once not held)
    StreamId stream = 0;
    // Held streams whose release it waits for: its own, held when it was recorded, and those
    // its stream was made to wait for (stream_wait_event); cleared when the host waits on it.
    std::vector<StreamId> held_by;
    std::uint64_t recorded = 0;  // the tick it was recorded at
    // The completion of what its stream had been made to wait for: a release of its held
    // streams completes it no sooner.
    std::uint64_t floor = 0;
    // What its stream had been made to wait for when it was recorded: (other stream, reach as
    // in waited_). A stream waiting on it waits for those too (CUDA's waits are transitive).
    std::vector<std::pair<StreamId, std::uint64_t>> inherited;
    bool held() const { return !held_by.empty(); }
  };
  std::unordered_map<EventId, Event> events_;
  std::unordered_set<StreamId> held_streams_;
  std::unordered_set<StreamId> captured_;                  // begin_capture() without end_capture()
  std::unordered_map<StreamId, std::uint64_t> last_work_;  // tick of each stream's latest work
  std::size_t held_events_ = 0;  // events held (release_stream scans only when some are)
  // stream_wait_event(): per stream, what its later events wait for; per (stream, other
  // stream), one past the latest record tick of an event of the other waited on (0: none).
  struct Waits {
    std::uint64_t floor = 0;     // its later events complete no sooner
    std::vector<StreamId> held;  // held streams whose release its later events wait for
  };
  std::unordered_map<StreamId, Waits> waits_;
  struct PairHash {
    std::size_t operator()(const std::pair<StreamId, StreamId>& p) const {
      return std::hash<StreamId>()(p.first) * 31 + std::hash<StreamId>()(p.second);
    }
  };
  std::unordered_map<std::pair<StreamId, StreamId>, std::uint64_t, PairHash> waited_;
};

}  // namespace cuarena
