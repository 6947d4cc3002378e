#pragma once
// The ladder of window levels a KV head may get, e.g. 1k,4k,16k,64k,full.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/core/window.hpp"

namespace headwise::measure {

using headwise::kFullWindow;

struct WindowLadder {
  std::vector<int64_t> levels;  // strictly ascending; kFullWindow, if present, is last

  size_t size() const { return levels.size(); }
  bool has_full() const { return !levels.empty() && levels.back() == kFullWindow; }
  // The window a level keeps at a context: full → the context itself.
  int64_t effective(size_t level, int64_t context) const;
  std::string to_string() const;  // "1k,4k,16k,64k,full"
};

// Parses "1k,4k,16k,64k,full" (k = 1024). `what` names the flag/field for errors.
WindowLadder parse_window_ladder(std::string_view text, std::string_view what);

}  // namespace headwise::measure
