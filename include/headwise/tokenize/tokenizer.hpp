#pragma once
// A Hugging Face tokenizer.json tokenizer in C++: byte-level BPE (GPT-2, Qwen, Llama 3,
// gpt-oss) and SentencePiece-style BPE with byte fallback (Llama 2, Gemma), with their
// normalizers, pre-tokenizers, added/special tokens, post-processor and decoder.
// Parity with the `tokenizers` library is tested on tests/tokenize/corpus.txt.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace headwise::tokenize {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a folder holding one. Unknown model, normalizer,
  // pre-tokenizer, decoder or post-processor types throw InputError naming file and type.
  static Tokenizer from_file(const std::filesystem::path& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (UTF-8; invalid UTF-8 throws InputError). With add_special_tokens,
  // the post-processor adds what the model expects (e.g. BOS), as `tokenizers` does.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids` through the tokenizer's decoder. Ids outside the vocabulary throw.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  // One more than the largest id of the model vocabulary and the added tokens: every id
  // this tokenizer can produce is below it.
  int64_t vocab_size() const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  // Empty when the id is unknown.
  std::string id_to_token(int64_t id) const;

  const std::filesystem::path& path() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace headwise::tokenize
