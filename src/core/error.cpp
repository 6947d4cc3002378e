#include "headwise/core/error.hpp"

#include <algorithm>

namespace headwise {
namespace {

// Field ids are plain snake_case words, so a pair of separators that never occurs in a message
// marks them unambiguously.
constexpr char kRefBegin = '\x1e';
constexpr char kRefEnd = '\x1f';

}  // namespace

std::string option_spelling(std::string_view field) {
  std::string flag = "--" + std::string(field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::string field_ref(std::string_view field) {
  return kRefBegin + std::string(field) + kRefEnd;
}

std::string FieldMessage::render(const FieldNamer& name) const {
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t begin = text_.find(kRefBegin, at);
    const size_t end = begin == std::string::npos ? begin : text_.find(kRefEnd, begin);
    if (end == std::string::npos) break;
    out.append(text_, at, begin - at);
    out += name(std::string_view(text_).substr(begin + 1, end - begin - 1));
    at = end + 1;
  }
  out.append(text_, at);
  return out;
}

FieldError::FieldError(std::string field, std::string text)
    : InputError(FieldMessage(field, text).render(option_spelling)),
      FieldMessage(std::move(field), std::move(text)) {}

FieldError FieldError::prefixed(std::string_view prefix) const {
  return FieldError(field(), std::string(prefix) + this->text());
}

InfeasibleFieldError::InfeasibleFieldError(std::string field, std::string text)
    : InfeasibleError(FieldMessage(field, text).render(option_spelling)),
      FieldMessage(std::move(field), std::move(text)) {}

}  // namespace headwise
