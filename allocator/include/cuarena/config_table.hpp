// Config tables: one row per key (name, accepted values, default, meaning, how it is read and
// written) drives parsing, to_string(), the error listing the valid keys, and the Markdown table
// of the README. The core's keys are Config::table(); the simulator's are SimConfig::table()
// (sim_backend.hpp); a front end parses one string into several tables (parse_config).
//
// Syntax is PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax: `key:value,key:value`, lists as
// `[a:b,>:c]`, booleans `True`/`False`. Sizes accept a plain byte count or a unit suffix
// (`512`, `64KiB`, `2MiB`, `80GiB` in powers of 1024; `80GB` in powers of 1000).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cuarena {

/// One `key:value` item of a config string.
struct ConfigItem {
  std::string_view key;    ///< as written
  std::string_view value;  ///< as written
  std::size_t position;    ///< of the key in the string, 0-based

  /// The value without surrounding whitespace.
  std::string text() const;
  /// Throws ConfigError: bad value for this key at this position, expected `expected`.
  [[noreturn]] void bad(std::string_view expected) const;
};

/// One key of a table over settings struct T.
template <class T>
struct ConfigKey {
  std::string key;
  std::string values;  ///< what is accepted ("a number in [0, 1]"): errors and the Markdown table
  std::string doc;     ///< what it does, one line of Markdown
  std::function<void(T&, const ConfigItem&)> set;  ///< reads, checks and stores; item.bad() if not
  /// The value in parse syntax (round-trips); empty: the key is unset and config_string() leaves
  /// it out (a setting the syntax cannot write, such as one that is off by being absent).
  std::function<std::string(const T&)> get;
};

template <class T>
using ConfigTable = std::vector<ConfigKey<T>>;

/// A table and the object parse_config() writes through it.
struct ConfigTarget {
  template <class T>
  ConfigTarget(const ConfigTable<T>& table, T& object)
      : keys(key_names(table)), set([&table, &object](const ConfigItem& item) {
          for (const ConfigKey<T>& k : table) {
            if (k.key == item.key) {
              k.set(object, item);
              return true;
            }
          }
          return false;
        }) {}

  std::vector<std::string> keys;
  std::function<bool(const ConfigItem&)> set;  ///< false: not a key of this table

  template <class T>
  static std::vector<std::string> key_names(const ConfigTable<T>& table) {
    std::vector<std::string> out;
    for (const ConfigKey<T>& k : table) out.push_back(k.key);
    return out;
  }
};

/// Parses `text` into `targets`, each key to the target whose table has it (a later duplicate
/// wins). Throws ConfigError naming the key and its position: an unknown key lists every
/// target's keys, a bad value says what the key expects, a syntax error says where.
void parse_config(std::string_view text, const std::vector<ConfigTarget>& targets);

/// `key:value,...` of every key of `table` that is set (its get() is not empty), in table order;
/// parse_config() reads it back equal.
template <class T>
std::string config_string(const ConfigTable<T>& table, const T& object) {
  std::string out;
  for (const ConfigKey<T>& k : table) {
    const std::string value = k.get(object);
    if (!value.empty()) out += (out.empty() ? "" : ",") + k.key + ":" + value;
  }
  return out;
}

/// The Markdown table of `table`'s keys with their defaults (T{}): a header when `header`, then
/// one row per key, `| key | default | values | meaning |`.
template <class T>
std::string config_markdown(const ConfigTable<T>& table, bool header) {
  std::string out = header ? "| key | default | values | meaning |\n|---|---|---|---|\n" : "";
  const T defaults{};
  for (const ConfigKey<T>& k : table)
    out += "| `" + k.key + "` | `" + k.get(defaults) + "` | " + k.values + " | " + k.doc + " |\n";
  return out;
}

// --- Reading and writing values (for the tables' rows) ------------------------------------------

/// A size within [lo, hi] (a power of two too, when `pow2`); item.bad() otherwise.
std::size_t read_size(const ConfigItem& item, std::size_t lo, std::size_t hi, bool pow2 = false);
std::uint64_t read_uint(const ConfigItem& item, std::uint64_t lo, std::uint64_t hi);
/// A finite number within [lo, hi], or (lo, hi] when `lo_open`.
double read_real(const ConfigItem& item, double lo, double hi, bool lo_open);
bool read_bool(const ConfigItem& item);
/// `bytes` exactly, in the largest unit dividing it: `2MiB`, `1536`, `0`.
std::string size_text(std::size_t bytes);
/// The shortest text that reads back as `value`.
std::string real_text(double value);
/// What read_size() accepts, in words ("a size from 512 to 256MiB").
std::string size_values(std::size_t lo, std::size_t hi, bool pow2);

inline constexpr std::size_t kNoSizeLimit = std::numeric_limits<std::size_t>::max();

template <class T, class M>
ConfigKey<T> size_key(std::string key, M T::*member, std::size_t lo, std::size_t hi,
                      std::string doc, bool pow2 = false) {
  return {std::move(key), size_values(lo, hi, pow2), std::move(doc),
          [=](T& t, const ConfigItem& i) { t.*member = M(read_size(i, lo, hi, pow2)); },
          [=](const T& t) { return size_text(std::size_t(t.*member)); }};
}

template <class T, class M>
ConfigKey<T> uint_key(std::string key, M T::*member, std::uint64_t lo, std::uint64_t hi,
                      std::string doc) {
  return {std::move(key), "an integer from " + std::to_string(lo) + " to " + std::to_string(hi),
          std::move(doc), [=](T& t, const ConfigItem& i) { t.*member = M(read_uint(i, lo, hi)); },
          [=](const T& t) { return std::to_string(t.*member); }};
}

template <class T>
ConfigKey<T> real_key(std::string key, double T::*member, double lo, double hi, bool lo_open,
                      std::string doc) {
  return {std::move(key),
          "a number in " + std::string(lo_open ? "(" : "[") + real_text(lo) + ", " + real_text(hi) +
              "]",
          std::move(doc),
          [=](T& t, const ConfigItem& i) { t.*member = read_real(i, lo, hi, lo_open); },
          [=](const T& t) { return real_text(t.*member); }};
}

template <class T>
ConfigKey<T> bool_key(std::string key, bool T::*member, std::string doc) {
  return {std::move(key), "True or False", std::move(doc),
          [=](T& t, const ConfigItem& i) { t.*member = read_bool(i); },
          [=](const T& t) { return std::string(t.*member ? "True" : "False"); }};
}

/// One of the names in `choices` (name, value).
template <class T, class E>
ConfigKey<T> choice_key(std::string key, E T::*member,
                        std::vector<std::pair<std::string, E>> choices, std::string doc) {
  std::string values = "one of";
  for (std::size_t n = 0; n < choices.size(); ++n)
    values += (n == 0 ? " " : ", ") + choices[n].first;
  return {std::move(key), values, std::move(doc),
          [=](T& t, const ConfigItem& i) {
            const std::string v = i.text();
            for (const auto& [name, value] : choices) {
              if (name == v) {
                t.*member = value;
                return;
              }
            }
            i.bad(values);
          },
          [=](const T& t) {
            for (const auto& [name, value] : choices) {
              if (value == t.*member) return name;
            }
            return std::string("?");
          }};
}

}  // namespace cuarena
