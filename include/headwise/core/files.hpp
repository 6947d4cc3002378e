#pragma once
// File helpers that keep the promise "no half-written output": every output goes to a
// temporary file in the destination folder and is renamed over the target when complete.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace headwise {

std::string read_text_file(const std::filesystem::path& path);
// Parses JSON; errors name the file and the line/column.
nlohmann::json read_json_file(const std::filesystem::path& path);

void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

// SHA-256 of bytes / of a file, lowercase hex.
std::string sha256_hex(std::string_view bytes);
std::string sha256_file_hex(const std::filesystem::path& path);

}  // namespace headwise
