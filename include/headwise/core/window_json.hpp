#pragma once
// Windows as headwise's JSON output writes them: the number of tokens, or "full" for
// kFullWindow (core/window.hpp). Apart from window.hpp, which CUDA sources include and which
// therefore stays free of nlohmann/json.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>

namespace headwise {

nlohmann::json window_json(int64_t window);

// One entry per window, in order (a layer's KV heads): [4096, "full", ...].
nlohmann::json windows_json(std::span<const int64_t> windows);

}  // namespace headwise
