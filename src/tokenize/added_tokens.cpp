#include "added_tokens.hpp"

#include <unicode/uchar.h>

#include "headwise/core/error.hpp"
#include "json_fields.hpp"
#include "utf8.hpp"

namespace headwise::tokenize {
namespace {

// Rust's char::is_alphanumeric() || '_': what single_word treats as part of a word.
bool is_word_char(char32_t cp) {
  if (cp == '_') return true;
  if (u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC)) return true;
  const auto category = u_charType(static_cast<UChar32>(cp));
  return category == U_DECIMAL_DIGIT_NUMBER || category == U_LETTER_NUMBER ||
         category == U_OTHER_NUMBER;
}

size_t previous_char_start(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

bool ends_with_word(std::string_view text, size_t end) {
  if (end == 0) return false;
  size_t pos = previous_char_start(text, end);
  return is_word_char(utf8::next(text, pos));
}

bool starts_with_word(std::string_view text, size_t begin) {
  if (begin >= text.size()) return false;
  return is_word_char(utf8::next(text, begin));
}

}  // namespace

void TokenMatcher::add(const std::string& pattern, size_t token_index) {
  if (pattern.empty()) return;
  int node = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const auto byte = static_cast<unsigned char>(pattern[i]);
    int child = i == 0 ? root_[byte] : 0;
    if (i > 0) {
      const auto it = nodes_[node].children.find(byte);
      if (it != nodes_[node].children.end()) child = it->second;
    }
    if (child == 0) {
      child = static_cast<int>(nodes_.size());
      nodes_.push_back(Node{});
      if (i == 0)
        root_[byte] = child;
      else
        nodes_[node].children[byte] = child;
    }
    node = child;
  }
  // A later duplicate content wins, like a later insertion into upstream's map.
  nodes_[node].token = static_cast<long>(token_index);
}

std::pair<size_t, size_t> TokenMatcher::longest_at(std::string_view text, size_t pos) const {
  int node = root_[static_cast<unsigned char>(text[pos])];
  std::pair<size_t, size_t> best{0, 0};
  for (size_t i = pos + 1; node != 0; ++i) {
    if (nodes_[node].token >= 0) best = {i - pos, static_cast<size_t>(nodes_[node].token)};
    if (i >= text.size()) break;
    const auto it = nodes_[node].children.find(static_cast<unsigned char>(text[i]));
    node = it == nodes_[node].children.end() ? 0 : it->second;
  }
  return best;
}

AddedVocabulary::AddedVocabulary(const nlohmann::json& list, const Normalizer* normalizer,
                                 const std::string& where) {
  if (list.is_null()) return;
  if (!list.is_array()) throw_input_error("{}: expected a list", where);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    const auto& item = list[i];
    AddedToken token;
    const auto& id = require_field(item, "id", at);
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw_input_error("{}: 'id' must be a non-negative integer", at);
    token.id = id.get<int32_t>();
    token.content = require_string(item, "content", at);
    token.single_word = item.value("single_word", false);
    token.lstrip = item.value("lstrip", false);
    token.rstrip = item.value("rstrip", false);
    token.normalized = item.value("normalized", !item.value("special", false));
    token.special = item.value("special", false);
    token.decoded = token.content;
    if (token.normalized) {
      if (normalizer) normalizer->normalize(token.decoded);
      normalized_.add(token.decoded, tokens_.size());
    } else {
      raw_.add(token.content, tokens_.size());
    }
    tokens_.push_back(std::move(token));
  }
}

std::vector<Segment> AddedVocabulary::split_with(const Segment& input,
                                                 const TokenMatcher& matcher) const {
  const std::string_view text = input.text;
  std::vector<Segment> out;
  size_t done = 0;  // end of the last emitted segment
  for (size_t pos = 0; pos < text.size();) {
    const auto [length, index] =
        matcher.empty() ? std::pair<size_t, size_t>{0, 0} : matcher.longest_at(text, pos);
    if (length == 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos, stop = pos + length;
    pos = stop;  // matches never overlap, even when one is rejected below
    if (token.single_word && (ends_with_word(text, start) || starts_with_word(text, stop)))
      continue;
    if (token.lstrip) {
      while (start > done) {
        size_t prev = previous_char_start(text, start), probe = prev;
        if (!utf8::is_whitespace(utf8::next(text, probe))) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t probe = stop;
        if (!utf8::is_whitespace(utf8::next(text, probe))) break;
        stop = probe;
      }
    }
    if (done < start)
      out.push_back(
          {std::string(text.substr(done, start - done)), -1, input.at_input_start && done == 0});
    out.push_back({std::string(text.substr(start, stop - start)), token.id, false});
    done = stop;
    pos = std::max(pos, stop);
  }
  if (done < text.size())
    out.push_back({std::string(text.substr(done)), -1, input.at_input_start && done == 0});
  return out;
}

std::vector<Segment> AddedVocabulary::split(std::string_view text,
                                            const Normalizer* normalizer) const {
  std::vector<Segment> out;
  for (auto& segment : split_with(Segment{std::string(text), -1, true}, raw_)) {
    if (segment.id >= 0) {
      out.push_back(std::move(segment));
      continue;
    }
    if (normalizer) normalizer->normalize(segment.text);
    for (auto& part : split_with(segment, normalized_)) {
      if (part.id >= 0 || !part.text.empty()) out.push_back(std::move(part));
    }
  }
  return out;
}

}  // namespace headwise::tokenize
