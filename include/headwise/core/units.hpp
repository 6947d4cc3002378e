#pragma once
// Sizes on the command line and in files: plain integers or k/m/g/t suffixes, always powers
// of 1024 (160k tokens = 163840; 48g bytes = 48 GiB). A `b`/`ib` tail is accepted on bytes.
#include <cstdint>
#include <string>
#include <string_view>

namespace headwise {

// `what` labels the value in the error message (the CLI passes its flag).
int64_t parse_token_count(std::string_view text, std::string_view what);
int64_t parse_byte_size(std::string_view text, std::string_view what);

// "48.00 GiB", "512 B": for human tables only; JSON always carries exact integers.
std::string format_bytes(int64_t bytes);
// "160k" when exact, else the plain number.
std::string format_tokens(int64_t tokens);

int64_t ceil_div(int64_t a, int64_t b);
int64_t round_up(int64_t value, int64_t multiple);

}  // namespace headwise
