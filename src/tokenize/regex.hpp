#pragma once
// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Hugging Face `tokenizers`
// uses Oniguruma; PCRE2 supports the same syntax for the patterns tokenizer.json files
// use (\p{L}, \p{N}, (?i:...), (?!\S), possessive-free alternations).
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace headwise::tokenize {

class Regex {
 public:
  // `where` names the file and field for the error message if the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches as [begin, end) byte offsets, left to right. `text` must be
  // valid UTF-8 (checked once by the caller, so the match loop skips PCRE2's own check).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace headwise::tokenize
