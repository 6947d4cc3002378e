#pragma once
// tokenizer.json "normalizer" section. Each normalizer rewrites a piece of text in place;
// the tokenizer applies it to each stretch of input between non-normalized added tokens,
// exactly where Hugging Face `tokenizers` applies it.
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace headwise::tokenize {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normalizer described by `config` (may be null: returns nullptr). `where` names
// the file and JSON path for errors; unknown types throw InputError naming them.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config, const std::string& where);

// Unicode normalization through ICU (forms: "NFC", "NFD", "NFKC", "NFKD").
std::string unicode_normalize(const std::string& text, const std::string& form);

}  // namespace headwise::tokenize
