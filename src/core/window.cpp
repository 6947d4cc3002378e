#include "headwise/core/window.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace headwise {

std::string window_labels(std::span<const int64_t> windows, std::string_view separator) {
  std::vector<std::string> labels;
  for (int64_t w : windows) labels.push_back(window_label(w));
  return fmt::format("{}", fmt::join(labels, separator));
}

}  // namespace headwise
