#include "decoders.hpp"

#include <unordered_map>

#include "headwise/core/error.hpp"
#include "json_fields.hpp"
#include "pre_tokenizers.hpp"
#include "utf8.hpp"

namespace headwise::tokenize {
namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  ByteLevelDecoder() {
    for (int b = 0; b < 256; ++b) {
      size_t pos = 0;
      to_byte_[utf8::next(byte_to_unicode(static_cast<unsigned char>(b)), pos)] =
          static_cast<unsigned char>(b);
    }
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& token : tokens) {
      // A token with any character outside the byte alphabet (an added token such as
      // "<|im_start|>" with a non-mapped character) is copied as is, like upstream.
      std::string mapped;
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size() && all_mapped;) {
        const auto it = to_byte_.find(utf8::next(token, pos));
        if (it == to_byte_.end())
          all_mapped = false;
        else
          mapped.push_back(static_cast<char>(it->second));
      }
      bytes += all_mapped ? mapped : token;
    }
    tokens.assign(1, utf8::decode_lossy(bytes));
  }

 private:
  std::unordered_map<char32_t, unsigned char> to_byte_;
};

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;  // consecutive byte tokens
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      // Valid UTF-8 becomes text; otherwise each byte token becomes one U+FFFD, as upstream.
      if (utf8::find_invalid(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending_count; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& token : tokens) {
      const int byte = parse_byte_token(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const auto& token : tokens) joined += token;
    tokens.assign(1, joined);
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      std::string out;
      size_t last = 0;
      for (size_t hit = token.find(pattern_); hit != std::string::npos;
           hit = token.find(pattern_, last)) {
        out.append(token, last, hit - last).append(content_);
        last = hit + pattern_.size();
      }
      token = out.append(token, last, std::string::npos);
    }
  }

 private:
  std::string pattern_, content_;
};

// Removes up to `start` leading and `stop` trailing copies of `content` from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      std::vector<char32_t> chars;
      for (size_t pos = 0; pos < token.size();) chars.push_back(utf8::next(token, pos));
      size_t begin = 0, end = chars.size();
      while (begin < start_ && begin < end && chars[begin] == content_) ++begin;
      while (chars.size() - end < stop_ && end > begin && chars[end - 1] == content_) --end;
      std::string out;
      for (size_t i = begin; i < end; ++i) utf8::append(out, chars[i]);
      token.swap(out);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_first)
      : replacement_(std::move(replacement)), drop_first_(drop_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // Upstream drops every replacement character of the first token, not just the first one.
      const std::string with = i == 0 && drop_first_ ? "" : " ";
      std::string out;
      size_t last = 0;
      for (size_t hit = tokens[i].find(replacement_); hit != std::string::npos;
           hit = tokens[i].find(replacement_, last)) {
        out.append(tokens[i], last, hit - last).append(with);
        last = hit + replacement_.size();
      }
      tokens[i] = out.append(tokens[i], last, std::string::npos);
    }
  }

 private:
  std::string replacement_;
  bool drop_first_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

char32_t single_char(const std::string& text, const std::string& where) {
  size_t pos = 0;
  const char32_t cp = text.empty() ? 0 : utf8::next(text, pos);
  if (text.empty() || pos != text.size())
    throw_input_error("{}: expected a single character, got '{}'", where, text);
  return cp;
}

std::unique_ptr<Decoder> make_replace_decoder(const nlohmann::json& config,
                                              const std::string& where) {
  const auto& pattern = require_field(config, "pattern", where);
  if (!pattern.contains("String"))
    throw_unsupported("{}: only String patterns are supported in a Replace decoder", where);
  return std::make_unique<ReplaceDecoder>(require_string(pattern, "String", where + ".pattern"),
                                          require_string(config, "content", where));
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = require_string(config, "type", where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") return make_replace_decoder(config, where);
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(
        single_char(require_string(config, "content", where), where),
        config.value("start", size_t{0}), config.value("stop", size_t{0}));
  }
  if (type == "Metaspace") {
    const std::string scheme = config.contains("prepend_scheme")
                                   ? require_string(config, "prepend_scheme", where)
                               : config.value("add_prefix_space", true) ? "always"
                                                                        : "never";
    return std::make_unique<MetaspaceDecoder>(require_string(config, "replacement", where),
                                              scheme != "never");
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    const auto& list = require_array(config, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto step = make_decoder(list[i], fmt::format("{}.decoders[{}]", where, i)))
        steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  throw_unsupported(
      "{}: unsupported decoder type '{}' (supported: ByteLevel, ByteFallback, Fuse, Replace, "
      "Strip, "
      "Metaspace, Sequence)",
      where, type);
}

}  // namespace headwise::tokenize
