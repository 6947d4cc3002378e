#pragma once
// Added (and special) tokens from tokenizer.json "added_tokens". They are cut out of the
// input before normalization (normalized=false) or right after it (normalized=true), with
// leftmost-longest matching and the lstrip / rstrip / single_word rules of `tokenizers`.
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "normalizers.hpp"

namespace headwise::tokenize {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  // What decode shows: for normalized tokens, the content after the normalizer (upstream
  // caches this form so the decoder can invert e.g. a Prepend("▁")).
  std::string decoded;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A stretch of input: either an added token (id >= 0) or text still to be tokenized.
struct Segment {
  std::string text;
  int32_t id = -1;
  bool at_input_start = false;
};

// Byte trie with leftmost-longest search over a fixed set of patterns.
class TokenMatcher {
 public:
  void add(const std::string& pattern, size_t token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest pattern starting exactly at `pos`: (length, token index), or length 0.
  std::pair<size_t, size_t> longest_at(std::string_view text, size_t pos) const;

 private:
  struct Node {
    std::map<unsigned char, int> children;
    long token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<int, 256> root_{};  // fast first-byte dispatch: most positions fail here
};

class AddedVocabulary {
 public:
  // `normalizer` may be null; it is applied to normalized tokens' contents, as upstream.
  AddedVocabulary(const nlohmann::json& list, const Normalizer* normalizer,
                  const std::string& where);

  // Splits `text` into segments, normalizing the non-token stretches.
  std::vector<Segment> split(std::string_view text, const Normalizer* normalizer) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Splits one stretch with one matcher; unmatched parts keep id -1.
  std::vector<Segment> split_with(const Segment& input, const TokenMatcher& matcher) const;

  std::vector<AddedToken> tokens_;
  TokenMatcher raw_, normalized_;
};

}  // namespace headwise::tokenize
