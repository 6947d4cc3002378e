#pragma once
// How headwise writes "no truncation" in code: a window larger than any context, so
// comparisons ("prefer the larger window", min(w, context)) need no special case.
// In files and flags it is the string "full".
#include <cstdint>
#include <limits>
#include <string>

namespace headwise {

inline constexpr int64_t kFullWindow = std::numeric_limits<int64_t>::max();

// "full" or the number of tokens.
inline std::string window_label(int64_t window) {
  return window == kFullWindow ? std::string("full") : std::to_string(window);
}

}  // namespace headwise
