#pragma once
// UTF-8 helpers for the tokenizer. Internal header: the tokenizer works on UTF-8 bytes
// throughout, as Hugging Face `tokenizers` does, so offsets stay byte offsets.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace headwise::tokenize::utf8 {

// Length in bytes of the sequence that starts with `lead` (1 for continuation/invalid bytes,
// so that loops always advance).
inline size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Decodes the code point at `pos` (text must be valid UTF-8) and advances `pos`.
char32_t next(std::string_view text, size_t& pos);
void append(std::string& out, char32_t cp);

// Byte offset of the first invalid sequence, or npos when the whole text is valid UTF-8.
size_t find_invalid(std::string_view bytes);

// Like Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string decode_lossy(std::string_view bytes);

// Rust's char::is_whitespace (the Unicode White_Space property), used by added-token
// lstrip/rstrip and the Strip normalizer.
bool is_whitespace(char32_t cp);

}  // namespace headwise::tokenize::utf8
