// Input checks and simple totals shared by every solver entry point.
#include <cmath>
#include <set>

#include "headwise/core/error.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::solve {

void validate_groups(const std::vector<Group>& groups) {
  int64_t max_total = 0;
  for (const auto& group : groups) {
    const auto where = fmt::format("layer {} KV head {}", group.layer_id, group.kv_head);
    if (group.options.empty()) throw_input_error("{}: no window options", where);
    std::set<int64_t> windows;
    int64_t max_bytes = 0;
    for (const auto& option : group.options) {
      const auto label = window_label(option.window);
      if (option.window < 0) throw_input_error("{}: negative window {}", where, option.window);
      if (!windows.insert(option.window).second)
        throw_input_error("{}: window {} listed twice", where, label);
      if (option.bytes < 0)
        throw_input_error("{}, window {}: negative bytes {}", where, label, option.bytes);
      if (!std::isfinite(option.distortion) || option.distortion < 0.0) {
        throw_input_error("{}, window {}: distortion must be finite and >= 0, got {}", where, label,
                          option.distortion);
      }
      max_bytes = std::max(max_bytes, option.bytes);
    }
    // Every partial sum of chosen bytes is bounded by this total, so one check covers them all.
    if (__builtin_add_overflow(max_total, max_bytes, &max_total)) {
      throw_input_error("{}: total bytes over all heads overflow a 64-bit integer", where);
    }
  }
}

int64_t min_total_bytes(const std::vector<Group>& groups) {
  int64_t total = 0;
  for (const auto& group : groups) {
    int64_t least = group.options.at(0).bytes;
    for (const auto& option : group.options) least = std::min(least, option.bytes);
    total += least;
  }
  return total;
}

int64_t max_window_total_bytes(const std::vector<Group>& groups) {
  int64_t total = 0;
  for (const auto& group : groups) {
    const Option* largest = &group.options.at(0);
    for (const auto& option : group.options) {
      if (option.window > largest->window) largest = &option;
    }
    total += largest->bytes;
  }
  return total;
}

}  // namespace headwise::solve
