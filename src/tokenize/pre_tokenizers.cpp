#include "pre_tokenizers.hpp"

#include <array>

#include "headwise/core/error.hpp"
#include "json_fields.hpp"
#include "regex.hpp"
#include "utf8.hpp"

namespace headwise::tokenize {
namespace {

// GPT-2's pre-tokenization pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

using Span = std::pair<size_t, size_t>;

// Cuts the piece into consecutive spans marked delimiter or not, covering all of it.
std::vector<std::pair<Span, bool>> cover(size_t size, const std::vector<Span>& matches,
                                         bool invert) {
  std::vector<std::pair<Span, bool>> spans;
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    if (prev != begin) spans.push_back({{prev, begin}, invert});
    spans.push_back({{begin, end}, !invert});
    prev = end;
  }
  if (prev != size) spans.push_back({{prev, size}, invert});
  return spans;
}

// Applies the delimiter behaviour, mirroring Hugging Face's NormalizedString::split.
std::vector<Span> apply_behavior(const std::vector<std::pair<Span, bool>>& spans,
                                 SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [span, is_match] : spans) out.push_back(span);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& [span, is_match] : spans) {
        if (!is_match) out.push_back(span);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& [span, is_match] : spans) {
        if (is_match && !previous_match && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      // Walk backwards: a delimiter joins the piece after it unless that one is a delimiter.
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->second && !previous_match && !out.empty()) {
          out.back().first = it->first.first;
        } else {
          out.push_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& [span, is_match] : spans) {
        if (is_match == previous_match && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
  }
  return out;
}

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  throw_input_error("{}: unknown split behavior '{}'", where, name);
}

// Regex- or literal-based split; the shared engine of Split, Digits, Whitespace, ...
class RegexSplit : public PreTokenizer {
 public:
  RegexSplit(const std::string& pattern, SplitBehavior behavior, bool invert,
             const std::string& where)
      : regex_(pattern, where), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    for (const auto& piece : pieces) {
      for (auto& part : split_piece(piece, regex_.find_all(piece.text), behavior_, invert_))
        out.push_back(std::move(part));
    }
    pieces.swap(out);
  }

 private:
  Regex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

std::string escape_literal(const std::string& literal) {
  // \Q...\E quotes everything; a literal \E inside is split out so it stays literal.
  std::string out = "\\Q";
  for (size_t pos = 0; pos < literal.size(); ++pos) {
    if (literal.compare(pos, 2, "\\E") == 0) {
      out += "\\E\\\\E\\Q";
      ++pos;
    } else {
      out.push_back(literal[pos]);
    }
  }
  return out + "\\E";
}

std::unique_ptr<PreTokenizer> make_split(const nlohmann::json& config, const std::string& where) {
  const auto& pattern = require_field(config, "pattern", where);
  std::string regex;
  if (pattern.contains("Regex")) {
    regex = require_string(pattern, "Regex", where + ".pattern");
  } else if (pattern.contains("String")) {
    regex = escape_literal(require_string(pattern, "String", where + ".pattern"));
  } else {
    throw_input_error("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
  const auto behavior = parse_behavior(require_string(config, "behavior", where), where);
  return std::make_unique<RegexSplit>(regex, behavior, config.value("invert", false), where);
}

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      split_ = std::make_unique<RegexSplit>(kGpt2Pattern, SplitBehavior::kIsolated, false, where);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& piece : pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text = " " + piece.text;
      }
    }
    if (split_) split_->pre_tokenize(pieces);
    for (auto& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (unsigned char b : piece.text) mapped += byte_to_unicode(b);
      piece.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<RegexSplit> split_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (auto& piece : pieces) {
      std::string text;
      text.reserve(piece.text.size() + replacement_.size());
      for (char c : piece.text) {
        if (c == ' ')
          text += replacement_;
        else
          text.push_back(c);
      }
      const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && piece.at_input_start))) {
        text.insert(0, replacement_);
      }
      Piece replaced{std::move(text), piece.at_input_start};
      if (!split_) {
        if (!replaced.text.empty()) out.push_back(std::move(replaced));
        continue;
      }
      std::vector<Span> matches;
      for (size_t hit = replaced.text.find(replacement_); hit != std::string::npos;
           hit = replaced.text.find(replacement_, hit + replacement_.size())) {
        matches.emplace_back(hit, hit + replacement_.size());
      }
      for (auto& part : split_piece(replaced, matches, SplitBehavior::kMergedWithNext, false))
        out.push_back(std::move(part));
    }
    pieces.swap(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

std::unique_ptr<PreTokenizer> make_metaspace(const nlohmann::json& config,
                                             const std::string& where) {
  const std::string replacement = require_string(config, "replacement", where);
  PrependScheme scheme = PrependScheme::kAlways;
  if (config.contains("prepend_scheme")) {
    const std::string name = require_string(config, "prepend_scheme", where);
    if (name == "always")
      scheme = PrependScheme::kAlways;
    else if (name == "first")
      scheme = PrependScheme::kFirst;
    else if (name == "never")
      scheme = PrependScheme::kNever;
    else
      throw_input_error("{}: unknown prepend_scheme '{}'", where, name);
  } else if (!config.value("add_prefix_space", true)) {
    scheme = PrependScheme::kNever;
  }
  return std::make_unique<Metaspace>(replacement, scheme, config.value("split", true));
}

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::vector<Piece> split_piece(const Piece& piece,
                               const std::vector<std::pair<size_t, size_t>>& matches,
                               SplitBehavior behavior, bool invert) {
  std::vector<Piece> out;
  for (const auto& [begin, end] :
       apply_behavior(cover(piece.text.size(), matches, invert), behavior)) {
    if (begin == end) continue;
    out.push_back({piece.text.substr(begin, end - begin), piece.at_input_start && begin == 0});
  }
  return out;
}

const std::string& byte_to_unicode(unsigned char b) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int shifted = 0;
    for (int byte = 0; byte < 256; ++byte) {
      // Printable Latin-1 bytes map to themselves; the rest to U+0100 onwards, in order.
      const bool printable =
          (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      utf8::append(t[byte], printable ? static_cast<char32_t>(byte)
                                      : static_cast<char32_t>(256 + shifted++));
    }
    return t;
  }();
  return table[b];
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config,
                                                 const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = require_string(config, "type", where);
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(config.value("add_prefix_space", true),
                                       config.value("use_regex", true), where);
  }
  if (type == "Split") return make_split(config, where);
  if (type == "Metaspace") return make_metaspace(config, where);
  if (type == "Digits") {
    const bool individual = config.value("individual_digits", false);
    return std::make_unique<RegexSplit>(
        "[0-9]", individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false, where);
  }
  if (type == "Whitespace")
    return std::make_unique<RegexSplit>(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, true, where);
  if (type == "WhitespaceSplit")
    return std::make_unique<RegexSplit>(R"(\s)", SplitBehavior::kRemoved, false, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    const auto& list = require_array(config, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto step = make_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i)))
        steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw_unsupported(
      "{}: unsupported pre_tokenizer type '{}' (supported: ByteLevel, Split, Metaspace, Digits, "
      "Whitespace, WhitespaceSplit, Sequence)",
      where, type);
}

}  // namespace headwise::tokenize
