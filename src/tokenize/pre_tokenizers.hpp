#pragma once
// tokenizer.json "pre_tokenizer" section: splits normalized text into pieces ("words")
// that the model encodes independently, and (ByteLevel) maps bytes to printable characters.
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace headwise::tokenize {

struct Piece {
  std::string text;
  // True when the piece begins at byte 0 of the original input: Metaspace's
  // prepend_scheme "first" only adds its prefix there.
  bool at_input_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// How a split treats the matched delimiters (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `piece` at `matches` ([begin, end) byte ranges, sorted, disjoint). With `invert`,
// the text between matches is treated as the delimiter instead. Empty pieces are dropped.
std::vector<Piece> split_piece(const Piece& piece,
                               const std::vector<std::pair<size_t, size_t>>& matches,
                               SplitBehavior behavior, bool invert);

// The GPT-2 byte-to-character table: byte b becomes the UTF-8 of a printable code point.
const std::string& byte_to_unicode(unsigned char b);

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config,
                                                 const std::string& where);

}  // namespace headwise::tokenize
