#include "vmm_tokens.hpp"

#include <stdexcept>
#include <string>

namespace cuarena::shim {

namespace {
// Token values: far from the driver's handles (small integers and host addresses), so that one
// is never taken for the other.
constexpr VmmTokens::Handle kTokenBase = 0xC0A4'0000'0000'0000ull;

// The calling thread's latest created token (cuMemCreate, then its cuMemAddressReserve).
thread_local VmmTokens::Handle t_pending = 0;

bool pending(const VmmTokens::Token& t) { return t.block == 0 && t.real == 0; }
}  // namespace

VmmTokens::Handle VmmTokens::create(std::size_t size, int device, Traits traits) {
  std::lock_guard lock(mu_);
  const Handle h = kTokenBase + ++next_;
  Token t;
  t.size = size;
  t.device = device;
  t.traits = traits;
  tokens_.emplace(h, t);
  t_pending = h;
  return h;
}

std::optional<VmmTokens::Handle> VmmTokens::pending_for(std::size_t size,
                                                        std::size_t granularity) const {
  std::lock_guard lock(mu_);
  auto it = tokens_.find(t_pending);
  if (it == tokens_.end() || !pending(it->second)) return std::nullopt;
  const std::size_t have = it->second.size;
  if (size > have || have - size >= granularity) return std::nullopt;
  return it->first;
}

void VmmTokens::bind(Handle h, DevicePtr block) {
  std::lock_guard lock(mu_);
  Token& t = tokens_.at(h);
  if (!pending(t) || block == 0) throw std::logic_error("VmmTokens::bind: token not pending");
  t.block = block;
  ranges_[block] = h;
  if (t_pending == h) t_pending = 0;
}

void VmmTokens::set_real(Handle h, Handle real) {
  std::lock_guard lock(mu_);
  Token& t = tokens_.at(h);
  if (!pending(t) || real == 0) throw std::logic_error("VmmTokens::set_real: token not pending");
  t.real = real;
  if (t_pending == h) t_pending = 0;
}

bool VmmTokens::is_token(Handle h) const {
  std::lock_guard lock(mu_);
  return tokens_.count(h) != 0;
}

std::optional<VmmTokens::Token> VmmTokens::get(Handle h) const {
  std::lock_guard lock(mu_);
  auto it = tokens_.find(h);
  if (it == tokens_.end()) return std::nullopt;
  return it->second;
}

VmmTokens::Map VmmTokens::map(DevicePtr va, std::size_t size, std::size_t offset, Handle h) {
  std::lock_guard lock(mu_);
  Token& t = tokens_.at(h);
  if (t.real != 0) return Map::kReal;
  auto r = ranges_.find(va);
  if (t.block == 0) {
    if (r == ranges_.end()) return Map::kMaterialize;
    // A served range bound to another token not mapped yet (two creates before two reserves):
    // tokens of one size and device are interchangeable until mapped, so this one takes the
    // block and the other is pending again.
    Token& o = tokens_.at(r->second);
    if (o.mapped || o.size != t.size || o.device != t.device || offset != 0 || size > t.size)
      return Map::kAlias;
    t.block = o.block;
    o.block = 0;
    r->second = h;
    t.mapped = true;
    if (t_pending == h) t_pending = 0;
    return Map::kBound;
  }
  if (va != t.block || offset != 0 || size > t.size || r == ranges_.end() || r->second != h)
    return Map::kAlias;
  t.mapped = true;
  return Map::kBound;
}

std::optional<VmmTokens::Token> VmmTokens::range(DevicePtr va) const {
  std::lock_guard lock(mu_);
  auto r = ranges_.find(va);
  if (r == ranges_.end()) return std::nullopt;
  return tokens_.at(r->second);
}

bool VmmTokens::unmap(DevicePtr va) {
  std::lock_guard lock(mu_);
  auto r = ranges_.find(va);
  if (r == ranges_.end()) return false;
  tokens_.at(r->second).mapped = false;
  return true;
}

VmmTokens::Freed VmmTokens::free_range(DevicePtr va) {
  std::lock_guard lock(mu_);
  Freed f;
  auto r = ranges_.find(va);
  if (r == ranges_.end()) return f;
  f.ours = true;
  const Handle h = r->second;
  ranges_.erase(r);
  auto it = tokens_.find(h);
  if (it != tokens_.end() && it->second.refs == 0) {  // released already
    f.block = it->second.block;
    tokens_.erase(it);
  }
  return f;
}

VmmTokens::Freed VmmTokens::release(Handle h) {
  std::lock_guard lock(mu_);
  Freed f;
  auto it = tokens_.find(h);
  if (it == tokens_.end()) return f;
  f.ours = true;
  Token& t = it->second;
  if (--t.refs > 0) return f;
  if (t.real != 0) {
    f.real = t.real;
    tokens_.erase(it);
  } else if (t.block == 0) {
    if (t_pending == h) t_pending = 0;
    tokens_.erase(it);  // never reserved or mapped: no memory
  } else if (ranges_.count(t.block) == 0) {
    f.block = t.block;  // the range went first
    tokens_.erase(it);
  }
  // else: the range is still the program's (CUDA keeps a mapping's memory until it is unmapped
  // and its range freed); free_range() frees the block. The token stays, with no references.
  return f;
}

std::optional<VmmTokens::Handle> VmmTokens::retain(DevicePtr va) {
  std::lock_guard lock(mu_);
  auto r = ranges_.find(va);
  if (r == ranges_.end()) return std::nullopt;
  ++tokens_.at(r->second).refs;
  return r->second;
}

std::size_t VmmTokens::tokens() const {
  std::lock_guard lock(mu_);
  return tokens_.size();
}

void VmmTokens::check() const {
  std::lock_guard lock(mu_);
  auto fail = [](const std::string& what) { throw std::logic_error("VmmTokens: " + what); };
  std::size_t bound_ranges = 0;
  for (const auto& [h, t] : tokens_) {
    if (t.block != 0 && t.real != 0) fail("token both bound and real");
    if (t.refs < 0) fail("negative references");
    const bool in_ranges = t.block != 0 && ranges_.count(t.block) != 0 && ranges_.at(t.block) == h;
    if (t.refs == 0 && !in_ranges) fail("token with no reference and no range kept");
    if (t.block != 0 && in_ranges) ++bound_ranges;
    if (t.block == 0 && t.refs == 0) fail("pending or real token with no reference");
  }
  if (bound_ranges != ranges_.size()) fail("a range whose token is gone or not bound to it");
}

}  // namespace cuarena::shim
