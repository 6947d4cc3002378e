#pragma once
// How headwise writes "no truncation" in code: a window larger than any context, so
// comparisons ("prefer the larger window", min(w, context)) need no special case.
// In files and flags it is the string "full".
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace headwise {

inline constexpr int64_t kFullWindow = std::numeric_limits<int64_t>::max();

// "full" or the number of tokens.
inline std::string window_label(int64_t window) {
  return window == kFullWindow ? std::string("full") : std::to_string(window);
}

// A list of windows as logs and tables show it: "2048,full" (labels joined by `separator`).
// Defined out of line: this header is included by CUDA sources, which fmt's checks do not build.
std::string window_labels(std::span<const int64_t> windows, std::string_view separator = ",");

}  // namespace headwise
