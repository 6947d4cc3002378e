#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.hpp"

#include <pcre2.h>

#include "headwise/core/error.hpp"

namespace headwise::tokenize {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

Regex::Regex(const std::string& pattern, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw_input_error("{}: regex '{}' does not compile at offset {}: {}", where, pattern,
                      error_offset, reinterpret_cast<const char*>(message));
  }
  // JIT makes pre-tokenization several times faster; without it PCRE2 still works.
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  // Match data is per call so that one Regex can be used from several threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0,
                                                data.get(), nullptr)
                              : pcre2_match(impl_->code, subject, text.size(), start,
                                            PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    HEADWISE_CHECK(rc >= 0, "PCRE2 match failed with code {}", rc);
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {
      // An empty match: step over one whole character, as Oniguruma's iterator does.
      if (begin >= text.size()) break;
      size_t pos = begin;
      pos += 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      start = pos;
      continue;
    }
    matches.emplace_back(begin, end);
    start = end;
  }
  return matches;
}

}  // namespace headwise::tokenize
