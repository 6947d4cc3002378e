// Windows in JSON output (eval's and mem-estimate's): tokens as numbers, kFullWindow as "full",
// the form policy files and curves files read back.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "headwise/core/window.hpp"
#include "headwise/core/window_json.hpp"

using namespace headwise;

TEST_CASE("windows in JSON: a number of tokens, or \"full\"", "[core]") {
  CHECK(window_json(4096).dump() == "4096");
  CHECK(window_json(kFullWindow).dump() == "\"full\"");
  const std::vector<int64_t> heads{32, kFullWindow, 128};
  CHECK(windows_json(heads).dump() == "[32,\"full\",128]");
  CHECK(windows_json(std::vector<int64_t>{}).dump() == "[]");
}
