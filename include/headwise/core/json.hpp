#pragma once
// JSON text → nlohmann::json with headwise's errors (read_json_file in files.hpp uses it).
#include <nlohmann/json.hpp>

#include <string_view>

namespace headwise {

// Nesting deeper than this is refused: nlohmann parses iteratively but copies recursively,
// so 200k nested brackets in a 400 KB config.json overflowed the stack (fuzz_config_spec).
// No file headwise reads nests deeper than a few levels.
inline constexpr int kMaxJsonDepth = 256;

// Errors (InputError) name `where` and, for syntax errors, the line and column.
nlohmann::json parse_json(std::string_view text, std::string_view where);

}  // namespace headwise
