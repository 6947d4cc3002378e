#include "headwise/measure/window_ladder.hpp"

#include <algorithm>

#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"

namespace headwise::measure {

int64_t WindowLadder::effective(size_t level, int64_t context) const {
  const int64_t w = levels.at(level);
  return std::min(w, context);
}

std::string WindowLadder::to_string() const {
  std::vector<std::string> parts;
  for (int64_t w : levels) parts.push_back(w == kFullWindow ? "full" : format_tokens(w));
  return fmt::format("{}", fmt::join(parts, ","));
}

WindowLadder parse_window_ladder(std::string_view text, std::string_view what) {
  WindowLadder ladder;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    if (item == "full") {
      ladder.levels.push_back(kFullWindow);
    } else {
      ladder.levels.push_back(parse_token_count(item, what));
    }
    start = comma + 1;
  }
  if (ladder.levels.empty()) throw_input_error("{}: no window levels", what);
  for (size_t i = 0; i < ladder.levels.size(); ++i) {
    const int64_t w = ladder.levels[i];
    if (w == kFullWindow && i + 1 != ladder.levels.size())
      throw_input_error("{}: 'full' must be the last level", what);
    if (i > 0 && w != kFullWindow && w <= ladder.levels[i - 1]) {
      throw_input_error("{}: levels must be strictly increasing ('{}')", what, text);
    }
  }
  return ladder;
}

}  // namespace headwise::measure
