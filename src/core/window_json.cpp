#include "headwise/core/window_json.hpp"

#include "headwise/core/window.hpp"

namespace headwise {

nlohmann::json window_json(int64_t window) {
  return window == kFullWindow ? nlohmann::json("full") : nlohmann::json(window);
}

nlohmann::json windows_json(std::span<const int64_t> windows) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t w : windows) out.push_back(window_json(w));
  return out;
}

}  // namespace headwise
