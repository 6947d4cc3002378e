#include "headwise/core/units.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "headwise/core/error.hpp"

namespace headwise {
namespace {

struct SizeParts {
  long double number = 0;
  int64_t multiplier = 1;
};

SizeParts split_size(std::string_view text, std::string_view what, bool bytes) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c)))
      s.push_back(static_cast<char>(std::tolower(c)));
  }
  if (s.empty()) throw_input_error("{}: empty size", what);
  if (bytes) {
    if (s.size() > 2 && s.ends_with("ib"))
      s.resize(s.size() - 2);
    else if (s.size() > 1 && s.back() == 'b')
      s.pop_back();
  }
  SizeParts parts;
  const char last = s.back();
  const std::string_view suffixes = "kmgt";
  if (auto pos = suffixes.find(last); pos != std::string_view::npos) {
    parts.multiplier = int64_t{1} << (10 * (pos + 1));
    s.pop_back();
  }
  if (s.empty()) throw_input_error("{}: '{}' has no number", what, text);
  size_t used = 0;
  bool ok = true;
  for (char c : s) ok &= (std::isdigit(static_cast<unsigned char>(c)) || c == '.');
  if (!ok || s.front() == '.' || std::count(s.begin(), s.end(), '.') > 1) {
    throw_input_error("{}: cannot parse '{}' (expected e.g. 4096, 160k, 48g)", what, text);
  }
  parts.number = std::stold(s, &used);
  return parts;
}

int64_t parse_size(std::string_view text, std::string_view what, bool bytes) {
  const SizeParts parts = split_size(text, what, bytes);
  const long double value = parts.number * static_cast<long double>(parts.multiplier);
  if (value > static_cast<long double>(std::numeric_limits<int64_t>::max() / 2)) {
    throw_input_error("{}: '{}' is too large", what, text);
  }
  const long double rounded = std::floor(value);
  if (rounded != value) throw_input_error("{}: '{}' is not a whole number", what, text);
  if (rounded <= 0) throw_input_error("{}: '{}' must be positive", what, text);
  return static_cast<int64_t>(rounded);
}

}  // namespace

int64_t parse_token_count(std::string_view text, std::string_view what) {
  return parse_size(text, what, /*bytes=*/false);
}

int64_t parse_byte_size(std::string_view text, std::string_view what) {
  return parse_size(text, what, /*bytes=*/true);
}

std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  long double value = static_cast<long double>(bytes);
  int unit = 0;
  while (std::fabs(static_cast<double>(value)) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", static_cast<double>(value), kUnits[unit]);
}

std::string format_tokens(int64_t tokens) {
  if (tokens >= 1024 && tokens % 1024 == 0) return fmt::format("{}k", tokens / 1024);
  return fmt::format("{}", tokens);
}

int64_t ceil_div(int64_t a, int64_t b) {
  HEADWISE_CHECK(b > 0 && a >= 0, "ceil_div({}, {})", a, b);
  return (a + b - 1) / b;
}

int64_t round_up(int64_t value, int64_t multiple) {
  return ceil_div(value, multiple) * multiple;
}

}  // namespace headwise
