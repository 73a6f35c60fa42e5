// CPU models of PyTorch's CUDA caching allocator. Every rule names the function of
// c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator unless said otherwise) or
// c10/core/AllocatorConfig.cpp it follows; constants are PyTorch's.
#include "cuarena/replay/torch_sim.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include "cuarena/config_table.hpp"
#include "cuarena/errors.hpp"
#include "cuarena/replay/replay_loop.hpp"
#include "cuarena/segment_size.hpp"

namespace cuarena::replay {

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kMinBlockSize = 512;  // every size is rounded to at least this
// PyTorch's segment sizes (get_allocation_size): the defaults of SegmentSizeRule.
constexpr SegmentSizeRule kTorchSegments{};
constexpr std::uint64_t kSmallSize = kTorchSegments.small_request;     // largest small request
constexpr std::uint64_t kSmallBuffer = kTorchSegments.small_segment;   // small segments, pages
constexpr std::uint64_t kLargeBuffer = kTorchSegments.medium_segment;  // large_segment_size
constexpr std::uint64_t kRoundLarge = kTorchSegments.granule;          // large segments' step
constexpr std::uint64_t kAddressBase = 0x7f0000000000ull;

bool all_digits(const std::string& t) {
  return !t.empty() && t.size() <= 15 &&
         std::all_of(t.begin(), t.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::uint64_t round_up(std::uint64_t v, std::uint64_t step) { return (v + step - 1) / step * step; }

// ---- PYTORCH_CUDA_ALLOC_CONF (AllocatorConfig::parseArgs and its helpers) ----

// The value as PyTorch's ConfigTokenizer sees it: whitespace is dropped, inside it too.
std::string compact(const ConfigItem& item) {
  std::string out;
  for (char c : item.value) {
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  }
  return out;
}

const std::string kSizeMbValues = "a whole number of MB, at least 20";

// max_split_size_mb, max_non_split_rounding_mb: PyTorch refuses values below
// large_segment_size_mb (20) and caps them at SIZE_MAX / MB, which max_split_size reads as no
// limit.
std::uint64_t read_size_mb(const ConfigItem& item, bool cap_is_no_limit) {
  const std::string t = compact(item);
  if (!all_digits(t) || std::stoull(t) < kLargeBuffer / kMiB) item.bad(kSizeMbValues);
  const std::uint64_t cap = TorchConf::kNoLimit / kMiB;
  const std::uint64_t mb = std::min<std::uint64_t>(std::stoull(t), cap);
  return mb == cap && cap_is_no_limit ? TorchConf::kNoLimit : mb * kMiB;
}

ConfigKey<TorchConf> size_mb_key(std::string key, std::uint64_t TorchConf::*member,
                                 bool cap_is_no_limit, std::string doc) {
  return {std::move(key), kSizeMbValues, std::move(doc),
          [=](TorchConf& c, const ConfigItem& i) { c.*member = read_size_mb(i, cap_is_no_limit); },
          [=](const TorchConf& c) {
            return std::to_string(c.*member == TorchConf::kNoLimit ? TorchConf::kNoLimit / kMiB
                                                                   : c.*member / kMiB);
          }};
}

const std::string kGcValues = "a number in (0, 1)";

double read_gc_threshold(const ConfigItem& item) {
  const std::string t = compact(item);
  char* end = nullptr;
  errno = 0;
  const double v = t.empty() ? 0 : std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0' || errno == ERANGE || !(v > 0 && v < 1)) item.bad(kGcValues);
  return v;
}

const std::string kDivisionsValues =
    "a power of two, or [MB:divisions,...,>:divisions] with MB a power of two and divisions a "
    "power of two or 0";

// A power of two (or 0 where `zero_ok`); item.bad() otherwise.
std::uint64_t read_divisions(const ConfigItem& item, const std::string& t, bool zero_ok) {
  if (!all_digits(t)) item.bad(kDivisionsValues);
  const std::uint64_t v = std::stoull(t);
  if ((v == 0 && !zero_ok) || (v != 0 && !std::has_single_bit(v))) item.bad(kDivisionsValues);
  return v;
}

// parseRoundUpPower2Divisions: one power of two for every size, or [MB:divisions,...,>:divisions]
// where the first entry also covers every interval below it and '>' every interval above the last;
// a list leaves the intervals it does not reach as they were (a repeated key), as PyTorch's does.
void read_divisions_list(const ConfigItem& item, TorchConf::Divisions& d) {
  const std::string t = compact(item);
  if (t.empty() || t.front() != '[') {
    d.fill(read_divisions(item, t, false));
    return;
  }
  if (t.back() != ']') item.bad(kDivisionsValues);
  const std::string list = t.substr(1, t.size() - 2);
  bool first = true;
  std::size_t last = 0;
  std::size_t at = 0;
  while (at < list.size()) {  // entries `bound:divisions`, a trailing ',' allowed
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string entry = list.substr(at, comma - at);
    at = comma + 1;
    const std::size_t colon = entry.find(':');
    if (colon == std::string::npos) item.bad(kDivisionsValues);
    const std::string bound = entry.substr(0, colon);
    const std::uint64_t value = read_divisions(item, entry.substr(colon + 1), true);
    if (bound == ">") {
      std::fill(d.begin() + std::min(last + 1, d.size()), d.end(), value);
      continue;
    }
    if (!all_digits(bound) || !std::has_single_bit(std::stoull(bound))) item.bad(kDivisionsValues);
    const std::size_t index =
        std::min<std::size_t>(std::bit_width(std::stoull(bound)) - 1, d.size() - 1);
    if (first) std::fill(d.begin(), d.begin() + index, value);
    first = false;
    d[index] = value;
    last = index;
  }
}

// Every interval written out, 1 MB up, the last as '>'; empty when all are 0 (the default).
std::string divisions_text(const TorchConf::Divisions& d) {
  if (std::all_of(d.begin(), d.end(), [](std::uint64_t v) { return v == 0; })) return "";
  std::string out = "[";
  for (std::size_t i = 0; i + 1 < d.size(); ++i)
    out += std::to_string(std::uint64_t{1} << i) + ":" + std::to_string(d[i]) + ",";
  return out + ">:" + std::to_string(d.back()) + "]";
}

}  // namespace

const ConfigTable<TorchConf>& TorchConf::table() {
  using C = TorchConf;
  static const ConfigTable<TorchConf> rows = {
      {"expandable_segments", "True or False",
       "the torch-*-sim row it names (checked against --allocator)",
       [](C& c, const ConfigItem& i) {
         const std::string v = compact(i);
         if (v != "True" && v != "False") i.bad("True or False");
         c.expandable_segments = v == "True";
       },
       [](const C& c) {
         return c.expandable_segments ? std::string(*c.expandable_segments ? "True" : "False")
                                      : std::string();
       }},
      {"garbage_collection_threshold", kGcValues,
       "fraction of the memory fraction above which cached blocks are freed (0: off)",
       [](C& c, const ConfigItem& i) { c.garbage_collection_threshold = read_gc_threshold(i); },
       [](const C& c) {
         return c.garbage_collection_threshold == 0 ? std::string()
                                                    : real_text(c.garbage_collection_threshold);
       }},
      size_mb_key("max_non_split_rounding_mb", &C::max_non_split_rounding, false,
                  "largest rounding up when an oversize block serves a request"),
      size_mb_key("max_split_size_mb", &C::max_split_size, true,
                  "blocks at least this large are never split"),
      {"roundup_power2_divisions", kDivisionsValues,
       "steps between powers of two that request sizes round up to, per interval",
       [](C& c, const ConfigItem& i) { read_divisions_list(i, c.roundup_power2_divisions); },
       [](const C& c) { return divisions_text(c.roundup_power2_divisions); }},
  };
  return rows;
}

TorchConf TorchConf::parse(const std::string& text) {
  TorchConf conf;
  try {
    parse_config(text, {ConfigTarget(table(), conf)});
  } catch (const ConfigError& e) {
    // The core's messages name the core; these are PyTorch's settings.
    const std::string_view core = "cuarena config: ";
    std::string_view why = e.what();
    if (why.starts_with(core)) why.remove_prefix(core.size());
    throw ConfigError("PyTorch allocator settings: " + std::string(why));
  }
  return conf;
}

std::uint64_t TorchConf::divisions_for(std::uint64_t size) const {
  // Interval i holds sizes in [2^(20+i), 2^(21+i)); below 1 MiB counts as the first.
  const int log_size = std::bit_width(size) - 1;
  const int index = std::clamp(log_size - 20, 0, int(kIntervals) - 1);
  return roundup_power2_divisions[std::size_t(index)];
}

std::uint64_t torch_round_size(std::uint64_t size, const TorchConf& conf) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::uint64_t divisions = conf.divisions_for(size);
  if (divisions <= 1 || size <= kMinBlockSize * divisions) return round_up(size, kMinBlockSize);
  // roundup_power2_next_division: the next of `divisions` equal steps above the power of two.
  if (std::has_single_bit(size)) return size;
  const std::uint64_t floor = std::bit_floor(size);
  const std::uint64_t step = floor / std::bit_floor(divisions);
  if (step == 0) return floor << 1;
  return round_up(size, step);
}

std::uint64_t torch_allocation_size(std::uint64_t rounded) {
  return segment_size(rounded, kTorchSegments);
}

// ---- The allocator's state ----

// PyTorch's Block: a piece of a segment, free (in its pool's set), allocated, or (expandable
// segments only) unmapped address space.
struct TorchCachingSim::Block {
  std::uint64_t addr = 0, size = 0, stream = 0, requested = 0;
  Pool* pool = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  Segment* expandable = nullptr;  // the expandable segment holding it, if any
  bool allocated = false;         // allocated, or freed with its free not yet completed
  bool mapped = true;
  Handle handle = 0;
  std::int64_t gc_count_base = 0;
  bool is_split() const { return prev || next; }
};

// BlockComparatorSize: best fit per stream, ties to the lowest address.
bool TorchCachingSim::BySize::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->addr < b->addr;
}

// BlockComparatorAddress: the unmapped pieces of expandable segments, per stream by address.
bool TorchCachingSim::ByAddress::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  return a->addr < b->addr;
}

struct TorchCachingSim::Pool {
  explicit Pool(bool s, bool p = false) : small(s), graph(p) {}
  bool small;
  bool graph;                            // a private pool's (owner_PrivatePool)
  std::set<Block*, BySize> blocks;       // free, mapped
  std::set<Block*, ByAddress> unmapped;  // expandable segments' unmapped address space
  std::int64_t get_free_blocks_call_count = 0;
};

// PrivatePool: a CUDA graph's own small and large pools. Its blocks serve only its requests and
// go back to the device only once the pool is released (graph_pools_freeable); expandable
// segments grow per pool as well as per stream.
struct TorchCachingSim::PrivatePool {
  Pool small{true, true}, large{false, true};
  bool released = false;  // releasePool was called: release_cached_blocks may free its segments
};

// ExpandableSegment: address space for 9/8 of the device, mapped in pages of 2 MiB (small
// pool) or 20 MiB (large pool).
struct TorchCachingSim::Segment {
  std::uint64_t base = 0, page = 0;
  std::vector<bool> mapped;  // per page
  std::uint64_t size() const { return page * mapped.size(); }
};

struct TorchCachingSim::Request {
  std::uint64_t stream = 0, size = 0, alloc_size = 0;
  Pool* pool = nullptr;
  Block* block = nullptr;
};

TorchCachingSim::TorchCachingSim(Options options)
    : options_(std::move(options)),
      small_(std::make_unique<Pool>(true)),
      large_(std::make_unique<Pool>(false)),
      address_top_(kAddressBase) {}

TorchCachingSim::~TorchCachingSim() = default;

TorchCachingSim::Block* TorchCachingSim::new_block() {
  if (spare_.empty()) return &storage_.emplace_back();
  Block* b = spare_.back();
  spare_.pop_back();
  *b = Block{};
  return b;
}

void TorchCachingSim::delete_block(Block* block) { spare_.push_back(block); }

// BlockPool::insert_into_blocks: the block's age for garbage collection starts now.
void TorchCachingSim::insert_free(Block* block) {
  block->gc_count_base = block->pool->get_free_blocks_call_count;
  block->pool->blocks.insert(block);
}

// ---- malloc ----

std::optional<TorchCachingSim::Handle> TorchCachingSim::malloc(std::uint64_t size,
                                                               std::uint64_t stream, PoolId pool) {
  Request r = make_request(size, stream, pool);
  // DeviceCachingAllocator::malloc, in PyTorch's order (no free-memory callbacks: only CUDA IPC
  // registers one):
  bool found = get_free_block(r);  // 1. best fit among the stream's cached blocks
  if (!found) {
    if (gc_enabled()) garbage_collect_cached_blocks();  // 2. garbage_collection_threshold
    found = alloc_block(r, false)                       // 3. a new segment, or more mapping
            || (release_available_cached_blocks(r)      // 4. free oversize cached blocks
                && alloc_block(r, false)) ||
            // 5. free every unsplit cached block, unless a capture is under way (the model
            // knows of one while a request goes to a private pool)
            (!r.pool->graph && release_cached_blocks() && alloc_block(r, true));
  }
  if (!found) {
    ++stats_.num_ooms;
    return std::nullopt;
  }
  const Block* b = alloc_found_block(r, size, should_split(r.block, r.size));
  return b->handle;
}

TorchCachingSim::Request TorchCachingSim::make_request(std::uint64_t size, std::uint64_t stream,
                                                       PoolId pool) {
  Request r;
  r.stream = stream;
  r.size = torch_round_size(size, options_.conf);
  r.pool = &get_pool(r.size, pool);
  r.alloc_size = torch_allocation_size(r.size);
  return r;
}

// get_pool: small (<= 1 MiB) or large, of the default pools or of the capture's private pool,
// made on its first request (create_or_incref_pool); a request to a released pool takes it up
// again.
TorchCachingSim::Pool& TorchCachingSim::get_pool(std::uint64_t size, PoolId pool) {
  const bool small = size <= kSmallSize;
  if (pool == kDefaultPool) return small ? *small_ : *large_;
  std::unique_ptr<PrivatePool>& p = private_pools_[pool];
  if (!p) p = std::make_unique<PrivatePool>();
  p->released = false;
  return small ? p->small : p->large;
}

// get_free_block: the smallest free block of the stream and pool that fits (size, then address).
bool TorchCachingSim::get_free_block(Request& r) {
  Pool& pool = *r.pool;
  if (gc_enabled()) ++pool.get_free_blocks_call_count;
  Block key;
  key.stream = r.stream;
  key.size = r.size;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != r.stream) return false;
  if ((*it)->expandable) {
    // A free block followed by unmapped space can grow: best fit ranks it by that larger
    // size, so a later (bigger) block that cannot grow as far is taken first.
    auto expandable_size = [](const Block* b) {
      return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
    };
    for (auto next = std::next(it); next != pool.blocks.end() && (*next)->stream == r.stream &&
                                    expandable_size(*next) < expandable_size(*it);
         ++next)
      it = next;
  }
  const std::uint64_t max_split = options_.conf.max_split_size;
  // Oversize blocks (>= max_split_size) serve only oversize requests, and only within
  // max_non_split_rounding of their size.
  if (r.size < max_split && (*it)->size >= max_split) return false;
  if (r.size >= max_split && (*it)->size >= r.size + options_.conf.max_non_split_rounding)
    return false;
  r.block = *it;
  pool.blocks.erase(it);
  return true;
}

// should_split: the small pool (and every expandable block) splits off any remainder of at
// least 512 B; the large pool only remainders above 1 MiB, and never oversize requests.
bool TorchCachingSim::should_split(const Block* block, std::uint64_t size) const {
  const std::uint64_t remaining = block->size - size;
  if (block->pool->small || options_.expandable) return remaining >= kMinBlockSize;
  return size < options_.conf.max_split_size && remaining > kSmallSize;
}

// alloc_found_block: the front of the block serves the request; the rest stays cached.
TorchCachingSim::Block* TorchCachingSim::alloc_found_block(Request& r, std::uint64_t requested,
                                                           bool split) {
  Block* block = r.block;
  if (split) {
    Block* rest = block;
    block = new_block();
    block->addr = rest->addr;
    block->size = r.size;
    block->stream = r.stream;
    block->pool = r.pool;
    block->expandable = rest->expandable;
    block->prev = rest->prev;
    if (block->prev) block->prev->next = block;
    block->next = rest;
    rest->prev = block;
    rest->addr += r.size;
    rest->size -= r.size;
    insert_free(rest);
  }
  block->allocated = true;
  block->requested = requested;
  block->handle = next_handle_++;
  live_.emplace(block->handle, block);
  allocated_ += block->size;
  requested_ += requested;
  return block;
}

// alloc_block: cudaMalloc a segment of get_allocation_size bytes (native), or map enough of an
// expandable segment for the request itself. A memory fraction is checked against the segment
// size in both modes.
bool TorchCachingSim::alloc_block(Request& r, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  if (options_.memory_limit && reserved_ + r.alloc_size > *options_.memory_limit) return false;
  if (options_.expandable) {
    r.block = try_allocate_expandable_block(r);
    return r.block != nullptr;
  }
  if (!device_has(r.alloc_size)) return false;  // cudaMalloc: out of memory
  Block* b = new_block();
  b->addr = reserve_address(r.alloc_size);
  b->size = r.alloc_size;
  b->stream = r.stream;
  b->pool = r.pool;
  r.block = b;
  ++native_segments_;
  ++stats_.num_device_alloc;
  add_reserved(std::int64_t(r.alloc_size));
  return true;
}

// release_available_cached_blocks (only with max_split_size set): cudaFree the smallest
// oversize block of the stream that covers the request, else the largest ones until their
// sizes add up to it.
bool TorchCachingSim::release_available_cached_blocks(const Request& r) {
  const std::uint64_t max_split = options_.conf.max_split_size;
  if (max_split == TorchConf::kNoLimit) return false;
  Pool& pool = *r.pool;
  Block key;
  key.stream = r.stream;
  key.size = std::max(r.size, max_split);
  auto it = pool.blocks.lower_bound(&key);
  // (PyTorch's release_block asserts on expandable blocks; the model leaves them cached.)
  if (it != pool.blocks.end() && (*it)->stream == r.stream) {
    if ((*it)->expandable) return false;
    release_block(*it);
    return true;
  }
  if (it == pool.blocks.begin()) return false;
  std::uint64_t released = 0;
  --it;
  while (released < key.size && (*it)->size >= max_split && (*it)->stream == r.stream &&
         !(*it)->expandable) {
    Block* cur = *it;
    const bool first = it == pool.blocks.begin();
    if (!first) --it;
    released += cur->size;
    release_block(cur);
    if (first) break;
  }
  return released >= key.size;
}

// release_cached_blocks: wait for every stream (blocks whose free is pending become free), then
// cudaFree every cached block that is a whole segment, and unmap the free pages of expandable
// segments: in the default pools, and in the private pools that were released (a live graph's
// pool keeps its memory).
bool TorchCachingSim::release_cached_blocks() {
  synchronize_and_free_events();
  release_blocks(*large_);
  release_blocks(*small_);
  for (auto& [id, pool] : private_pools_) {
    if (!pool->released) continue;
    release_blocks(pool->small);
    release_blocks(pool->large);
  }
  return true;
}

void TorchCachingSim::release_pool(PoolId pool) {
  auto it = private_pools_.find(pool);
  if (it != private_pools_.end()) it->second->released = true;
}

void TorchCachingSim::synchronize_and_free_events() {
  ++stats_.num_sync_all_streams;
  for (Handle h : pending_) {
    auto it = live_.find(h);
    Block* b = it->second;
    live_.erase(it);
    free_block(b);
  }
  pending_.clear();
}

// release_blocks: whole free segments go back to the device; expandable blocks are unmapped
// page by page, and a segment left entirely unmapped is released.
void TorchCachingSim::release_blocks(Pool& pool) {
  std::vector<Block*> to_unmap;
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* b = *it++;
    if (b->expandable)
      to_unmap.push_back(b);
    else if (!b->is_split())
      release_block(b);
  }
  for (Block* b : to_unmap) {
    unmap_block(b);
    if (!b->mapped && !b->is_split()) release_expandable_segment(b);
  }
}

// release_block: cudaFree one whole segment. (PyTorch asserts it is never an expandable block;
// oversize and garbage-collected blocks are whole segments.)
void TorchCachingSim::release_block(Block* block) {
  block->pool->blocks.erase(block);
  release_address(block->addr, block->size);
  add_reserved(-std::int64_t(block->size));
  --native_segments_;
  ++stats_.num_device_free;
  delete_block(block);
}

// garbage_collect_cached_blocks: above garbage_collection_threshold of the allowed memory, free
// whole cached large segments that have gone unused for at least the average number of
// get_free_block calls, repeating until enough is reclaimed.
void TorchCachingSim::garbage_collect_cached_blocks() {
  const auto threshold =
      std::uint64_t(options_.conf.garbage_collection_threshold * double(*options_.memory_limit));
  if (reserved_ <= threshold) return;
  const std::uint64_t target = reserved_ - threshold;
  Pool& pool = *large_;
  auto age = [&](const Block* b) {
    return std::uint64_t(pool.get_free_blocks_call_count - b->gc_count_base);
  };
  auto freeable = [](const Block* b) { return !b->is_split() && !b->expandable; };
  std::uint64_t total_age = 0, reclaimed = 0;
  std::int64_t count = 0;
  for (const Block* b : pool.blocks) {
    if (!freeable(b)) continue;
    total_age += age(b);
    ++count;
  }
  bool freed = count > 0;
  while (reclaimed < target && freed && count > 0) {
    const double threshold_age = double(total_age) / double(count);
    freed = false;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* b = *it++;
      if (!freeable(b) || double(age(b)) < threshold_age) continue;
      freed = true;
      reclaimed += b->size;
      total_age -= age(b);
      --count;
      release_block(b);
    }
  }
}

// ---- free ----

void TorchCachingSim::free_requested(Handle h) {
  if (live_.count(h)) pending_.insert(h);
}

void TorchCachingSim::free_completed(Handle h) {
  auto it = live_.find(h);
  if (it == live_.end()) return;
  Block* b = it->second;
  live_.erase(it);
  pending_.erase(h);
  free_block(b);
}

// free_block: merge with free neighbours of the same segment, then cache.
void TorchCachingSim::free_block(Block* block) {
  block->allocated = false;
  allocated_ -= block->size;
  requested_ -= block->requested;
  block->requested = 0;
  try_merge_blocks(block, block->prev);
  try_merge_blocks(block, block->next);
  insert_free(block);
}

// try_merge_blocks: dst absorbs a free neighbour src of the same mapping state.
std::uint64_t TorchCachingSim::try_merge_blocks(Block* dst, Block* src) {
  if (!src || src->allocated || dst->mapped != src->mapped) return 0;
  if (src->mapped)
    src->pool->blocks.erase(src);
  else
    src->pool->unmapped.erase(src);
  if (dst->prev == src) {
    dst->addr = src->addr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  dst->size += src->size;
  const std::uint64_t subsumed = src->size;
  delete_block(src);
  return subsumed;
}

void TorchCachingSim::empty_cache() { release_cached_blocks(); }

// ---- expandable segments ----

// try_allocate_expandable_block: map pages after (or over) the lowest free address space of the
// stream's segment until one free block covers the request.
TorchCachingSim::Block* TorchCachingSim::try_allocate_expandable_block(const Request& r) {
  Block* c = find_expandable_block(r.stream, *r.pool, r.size);
  if (!c->mapped && !map_block(c, std::min(c->size, r.size))) return nullptr;
  while (c->size < r.size) {
    Block* next = c->next;  // unmapped: mapping it merges c into it
    if (!map_block(next, std::min(r.size - c->size, next->size))) return nullptr;
    c = next;
  }
  r.pool->blocks.erase(c);
  return c;
}

// find_expandable_block: the lowest-addressed unmapped range of the stream's segments that,
// with the free block just before it, has room for `size`; else a new segment.
TorchCachingSim::Block* TorchCachingSim::find_expandable_block(std::uint64_t stream, Pool& pool,
                                                               std::uint64_t size) {
  auto allocatable = [](const Block* b) { return b && !b->allocated; };
  auto has_room = [&](const Block* b) {
    std::uint64_t bytes = 0;
    for (; bytes < size && allocatable(b); b = b->next) bytes += b->size;
    return bytes >= size;
  };
  Block key;
  key.stream = stream;
  for (auto it = pool.unmapped.lower_bound(&key);
       it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    Block* c = allocatable((*it)->prev) ? (*it)->prev : *it;
    if (has_room(c)) return c;
  }
  auto segment = std::make_unique<Segment>();
  segment->page = pool.small ? kSmallBuffer : kLargeBuffer;
  const std::uint64_t space = options_.device_bytes + options_.device_bytes / 8;
  segment->mapped.assign((space + segment->page - 1) / segment->page, false);
  segment->base = reserve_address(segment->size());
  Block* c = new_block();
  c->addr = segment->base;
  c->size = segment->size();
  c->stream = stream;
  c->pool = &pool;
  c->mapped = false;
  c->expandable = segment.get();
  expandable_segments_.push_back(std::move(segment));
  pool.unmapped.insert(c);
  return c;
}

// map_block + ExpandableSegment::map: back the pages under [addr, addr + size) with memory
// (whole pages, so possibly more than asked); the mapped part becomes a free block merged with
// its free neighbours.
bool TorchCachingSim::map_block(Block* to_map, std::uint64_t size) {
  Segment& s = *to_map->expandable;
  const std::uint64_t first = (to_map->addr - s.base) / s.page;
  const std::uint64_t end = (to_map->addr + size - s.base + s.page - 1) / s.page;
  const std::uint64_t bytes = (end - first) * s.page;
  if (bytes == 0 || !device_has(bytes)) return false;  // cuMemCreate: out of memory
  for (std::uint64_t p = first; p < end; ++p) s.mapped[p] = true;
  Pool& pool = *to_map->pool;
  pool.unmapped.erase(to_map);
  to_map->mapped = true;
  if (bytes < to_map->size) {
    Block* rest = new_block();
    rest->addr = to_map->addr + bytes;
    rest->size = to_map->size - bytes;
    rest->stream = to_map->stream;
    rest->pool = &pool;
    rest->expandable = to_map->expandable;
    rest->mapped = false;
    rest->prev = to_map;
    rest->next = to_map->next;
    if (rest->next) rest->next->prev = rest;
    to_map->next = rest;
    to_map->size = bytes;
    pool.unmapped.insert(rest);
  }
  try_merge_blocks(to_map, to_map->prev);
  try_merge_blocks(to_map, to_map->next);
  insert_free(to_map);
  ++stats_.num_device_alloc;
  add_reserved(std::int64_t(bytes));
  return true;
}

// unmap_block + ExpandableSegment::unmap: give back the whole pages inside a free block; the
// parts of pages at its ends stay mapped as free blocks.
void TorchCachingSim::unmap_block(Block* block) {
  Segment& s = *block->expandable;
  const std::uint64_t first = (block->addr - s.base + s.page - 1) / s.page;
  const std::uint64_t end = (block->addr + block->size - s.base) / s.page;
  if (first >= end) return;
  Pool& pool = *block->pool;
  pool.blocks.erase(block);
  const std::uint64_t lo = s.base + first * s.page, hi = s.base + end * s.page;
  auto piece = [&](std::uint64_t addr, std::uint64_t size) {
    Block* b = new_block();
    b->addr = addr;
    b->size = size;
    b->stream = block->stream;
    b->pool = &pool;
    b->expandable = block->expandable;
    return b;
  };
  if (lo > block->addr) {  // prev -> before -> block
    Block* before = piece(block->addr, lo - block->addr);
    before->prev = block->prev;
    if (before->prev) before->prev->next = before;
    before->next = block;
    block->prev = before;
    insert_free(before);
  }
  if (block->addr + block->size > hi) {  // block -> after -> next
    Block* after = piece(hi, block->addr + block->size - hi);
    after->next = block->next;
    if (after->next) after->next->prev = after;
    after->prev = block;
    block->next = after;
    insert_free(after);
  }
  block->addr = lo;
  block->size = hi - lo;
  block->mapped = false;
  try_merge_blocks(block, block->prev);
  try_merge_blocks(block, block->next);
  pool.unmapped.insert(block);
  for (std::uint64_t p = first; p < end; ++p) s.mapped[p] = false;
  ++stats_.num_device_free;
  add_reserved(-std::int64_t(hi - lo));
}

// release_expandable_segment: a segment that is one unmapped block gives back its address space.
void TorchCachingSim::release_expandable_segment(Block* block) {
  block->pool->unmapped.erase(block);
  release_address(block->expandable->base, block->expandable->size());
  auto it = std::find_if(expandable_segments_.begin(), expandable_segments_.end(),
                         [&](const auto& s) { return s.get() == block->expandable; });
  expandable_segments_.erase(it);
  delete_block(block);
}

// ---- the simulated device ----

// Virtual addresses: the lowest free range that fits, 2 MiB aligned (every segment size is a
// 2 MiB multiple). Only ties between equal-sized free blocks depend on them.
std::uint64_t TorchCachingSim::reserve_address(std::uint64_t size) {
  for (auto it = free_addresses_.begin(); it != free_addresses_.end(); ++it) {
    if (it->second - it->first < size) continue;
    const std::uint64_t addr = it->first, end = it->second;
    free_addresses_.erase(it);
    if (addr + size < end) free_addresses_.emplace(addr + size, end);
    return addr;
  }
  const std::uint64_t addr = address_top_;
  address_top_ += round_up(size, kRoundLarge);
  return addr;
}

void TorchCachingSim::release_address(std::uint64_t addr, std::uint64_t size) {
  std::uint64_t lo = addr, hi = addr + round_up(size, kRoundLarge);
  auto next = free_addresses_.lower_bound(lo);
  if (next != free_addresses_.end() && next->first == hi) {
    hi = next->second;
    next = free_addresses_.erase(next);
  }
  if (next != free_addresses_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == lo) {
      lo = prev->first;
      free_addresses_.erase(prev);
    }
  }
  if (hi == address_top_)
    address_top_ = lo;
  else
    free_addresses_.emplace(lo, hi);
}

bool TorchCachingSim::device_has(std::uint64_t bytes) const {
  const std::uint64_t total = options_.memory_limit
                                  ? std::min(*options_.memory_limit, options_.device_bytes)
                                  : options_.device_bytes;
  return reserved_ + bytes <= total;
}

void TorchCachingSim::add_reserved(std::int64_t bytes) {
  reserved_ = std::uint64_t(std::int64_t(reserved_) + bytes);
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  interval_peak_ = std::max(interval_peak_, reserved_);
}

// PyTorch counts and collects only under a memory fraction (set_fraction).
bool TorchCachingSim::gc_enabled() const {
  return options_.memory_limit.has_value() && options_.conf.garbage_collection_threshold > 0;
}

std::uint64_t TorchCachingSim::address(Handle h) const { return live_.at(h)->addr; }
std::uint64_t TorchCachingSim::block_size(Handle h) const { return live_.at(h)->size; }

std::size_t TorchCachingSim::segment_count() const {
  return native_segments_ + expandable_segments_.size();
}

TorchCachingSim::FreeInfo TorchCachingSim::free_info() const {
  FreeInfo info;
  std::vector<const Pool*> pools{small_.get(), large_.get()};
  for (const auto& [id, p] : private_pools_) {
    pools.push_back(&p->small);
    pools.push_back(&p->large);
  }
  for (const Pool* pool : pools) {
    for (const Block* b : pool->blocks) {
      info.free_bytes += b->size;
      ++info.free_blocks;
      info.largest_free = std::max(info.largest_free, b->size);
    }
  }
  return info;
}

// ---- replay ----

namespace {

struct TorchRun {
  Result result;
  std::uint64_t peak = 0;
  std::size_t peak_index = 0;  // the event during which reserved memory last rose to `peak`
};

constexpr std::size_t kWholeTrace = std::size_t(-1);

TorchCachingSim::Options sim_options(const TorchSimOptions& o) {
  TorchCachingSim::Options so;
  so.conf = o.conf;
  so.expandable = o.expandable;
  if (o.capacity) {  // as torch.cuda.set_per_process_memory_fraction(capacity / device)
    so.memory_limit = o.capacity;
    so.device_bytes = std::max<std::uint64_t>(so.device_bytes, o.capacity);
  }
  return so;
}

// The first failed request and what was free just after PyTorch gave up (it has released
// every whole cached segment by then): the free blocks, each a maximal free piece of its
// segment, and what the limit left unreserved.
Result::FirstOom describe_oom(const TorchCachingSim& sim, std::size_t index, std::uint64_t request,
                              const TorchCachingSim::Options& o) {
  const TorchCachingSim::FreeInfo f = sim.free_info();
  const std::uint64_t limit = o.memory_limit.value_or(o.device_bytes);
  Result::FirstOom oom{index, request, f.free_bytes, f.free_blocks, f.largest_free, 0};
  oom.unreserved = limit > sim.reserved_bytes() ? limit - sim.reserved_bytes() : 0;
  return oom;
}

// Replays the trace, each allocation from the pool `pools` names; stops at the first
// out-of-memory when `stop_at_oom`. Feeds `series` (when given) the most reserved bytes during
// each event. With `measure_at`, replays events [0, measure_at] and fills the figures of the
// peak (free memory, fragmentation, rounding waste, segments) from the state after the last:
// measuring at every new peak cost a pass over the cached blocks each time, quadratic when the
// peak rises on most events (many streams).
TorchRun run_torch(const std::vector<Event>& events, const TorchGraphPools& pools,
                   const TorchSimOptions& options, bool stop_at_oom,
                   SeriesRecorder* series = nullptr, std::size_t measure_at = kWholeTrace) {
  TorchCachingSim sim(sim_options(options));
  TorchRun run;
  Result& r = run.result;
  using Handle = std::optional<TorchCachingSim::Handle>;  // nullopt: the allocation failed
  struct Hooks : TraceHooks<Handle> {
    TorchCachingSim& sim;
    const TorchGraphPools& pools;
    const TorchSimOptions& options;
    TorchRun& run;
    SeriesRecorder* series;
    bool stop_at_oom;
    bool released = false;      // the cache was released since the last alloc or free
    std::size_t next_pool = 0;  // pools.released[next_pool] is the next pool the recording released

    void on_event(std::size_t i, const Event& e) {
      switch (e.action) {
        case Action::kSegmentFree:
        case Action::kSegmentUnmap:
        case Action::kOom:
          // The recording allocator gave memory back, or failed a request: the program called
          // emptyCache(), or malloc went down its out-of-memory path. Both end in
          // release_cached_blocks, so the model releases its cache here once. (The failed
          // request itself is not replayed.) A graph pool the recording released by then
          // goes back with the rest.
          for (; next_pool < pools.released.size() && pools.released[next_pool].first <= i;
               ++next_pool)
            sim.release_pool(pools.released[next_pool].second);
          if (!released) sim.empty_cache();
          released = true;
          break;  // (a release cannot raise the peak checked below)
        case Action::kAlloc:
        case Action::kFreeCompleted:
          released = false;
          break;
        default:
          break;
      }
    }
    Handle on_alloc(std::size_t i, const Event& e) {
      const Handle h = sim.malloc(e.size, e.stream, pools.pool_of(i));
      if (!h && run.result.ooms++ == 0)
        run.result.first_oom = describe_oom(sim, i, e.size, sim_options(options));
      return h;
    }
    void on_free(std::size_t, const Event&, Handle& h) {
      if (h) sim.free_completed(*h);
    }
    void on_free_requested(std::size_t, const Event&, Handle& h) {
      if (h) sim.free_requested(*h);  // in use until its free_completed
    }
    bool after(std::size_t i, const Event&) {
      if (sim.peak_reserved_bytes() > run.peak) {
        run.peak = sim.peak_reserved_bytes();
        run.peak_index = i;
      }
      if (series) series->add(sim.take_interval_peak());
      return !(stop_at_oom && run.result.ooms);
    }
  } hooks{{}, sim, pools, options, run, series, stop_at_oom};
  const TraceCounts counts =
      run_trace<Handle>(events, hooks, measure_at == kWholeTrace ? events.size() : measure_at + 1);
  if (measure_at != kWholeTrace) {  // where memory sits at the peak
    const TorchCachingSim::FreeInfo f = sim.free_info();
    r.free_at_peak_bytes = f.free_bytes;
    r.external_fragmentation =
        f.free_bytes ? 1.0 - double(f.largest_free) / double(f.free_bytes) : 0.0;
    r.rounding_waste_bytes = sim.allocated_bytes() - sim.requested_bytes();
    r.counters["peak.segments"] = std::int64_t(sim.segment_count());
  }
  r.allocs = counts.allocs;
  r.frees = counts.frees;
  r.skipped_events = counts.skipped;
  const TorchCachingSim::Stats& s = sim.stats();
  r.counters["num_device_alloc"] = s.num_device_alloc;
  r.counters["num_device_free"] = s.num_device_free;
  r.counters["num_alloc_retries"] = s.num_alloc_retries;
  r.counters["num_sync_all_streams"] = s.num_sync_all_streams;
  r.peak_reserved_bytes = sim.peak_reserved_bytes();
  if (options.capacity) r.capacity_bytes = options.capacity;
  return run;
}

}  // namespace

Result replay_torch_sim(const std::vector<Event>& events, const TorchSimOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::optional<SeriesRecorder> rec;
  if (options.series) rec.emplace(events.size());
  const TorchGraphPools pools = infer_graph_pools(events);
  const TorchRun run = run_torch(events, pools, options, false, rec ? &*rec : nullptr);
  Result r = run.result;
  if (rec) r.series = rec->finish(events);
  if (run.peak > 0) {  // the replay is deterministic: again, up to the peak, to measure there
    const Result at_peak = run_torch(events, pools, options, false, nullptr, run.peak_index).result;
    r.free_at_peak_bytes = at_peak.free_at_peak_bytes;
    r.external_fragmentation = at_peak.external_fragmentation;
    r.rounding_waste_bytes = at_peak.rounding_waste_bytes;
    r.counters["peak.segments"] = at_peak.counters.at("peak.segments");
  }
  r.allocator = options.expandable ? "torch-expandable-sim" : "torch-native-sim";
  r.backend = "sim";
  r.peak_requested_bytes = peak_requested(events);
  r.reserved_ratio =
      r.peak_requested_bytes ? double(r.peak_reserved_bytes) / double(r.peak_requested_bytes) : 0;
  r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::optional<std::uint64_t> torch_sim_min_capacity(const std::vector<Event>& events,
                                                    const TorchSimOptions& options,
                                                    std::uint64_t known_good) {
  const TorchGraphPools pools = infer_graph_pools(events);
  auto fits = [&](std::uint64_t capacity) {
    TorchSimOptions o = options;
    o.capacity = capacity;
    return run_torch(events, pools, o, true).result.ooms == 0;
  };
  return search_min_capacity(kRoundLarge, peak_requested(events), known_good, kMaxDeviceBytes,
                             fits);
}

bool is_torch_sim(const std::string& allocator) {
  return allocator == "torch-native-sim" || allocator == "torch-expandable-sim";
}

void check_torch_conf(const std::string& torch_conf, const std::vector<std::string>& allocators) {
  const bool any = std::any_of(allocators.begin(), allocators.end(), is_torch_sim);
  if (torch_conf.empty()) return;
  if (!any)
    throw ConfigError(
        "--torch-conf applies to the torch-native-sim and torch-expandable-sim "
        "rows: add one with --allocator");
  TorchConf conf;
  try {
    conf = TorchConf::parse(torch_conf);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("--torch-conf: ") + e.what());
  }
  if (!conf.expandable_segments) return;
  const std::string clash = *conf.expandable_segments ? "torch-native-sim" : "torch-expandable-sim";
  if (std::find(allocators.begin(), allocators.end(), clash) != allocators.end())
    throw ConfigError("--torch-conf expandable_segments:" +
                      std::string(*conf.expandable_segments ? "True" : "False") +
                      " contradicts --allocator " + clash + " (the row's name sets the mode)");
}

Result replay_torch_sim_row(const std::string& allocator, const std::vector<Event>& events,
                            const SimOptions& options, bool min_capacity) {
  TorchSimOptions o;
  o.conf = TorchConf::parse(options.torch_conf);
  o.expandable = allocator == "torch-expandable-sim";
  o.capacity = options.capacity ? options.capacity : options.device.capacity;
  o.series = options.series;
  Result r = replay_torch_sim(events, o);
  if (min_capacity) r.min_capacity_bytes = torch_sim_min_capacity(events, o, r.peak_reserved_bytes);
  return r;
}

}  // namespace cuarena::replay
