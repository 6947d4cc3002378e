#include "normalizers.hpp"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <vector>

#include "headwise/core/error.hpp"
#include "json_fields.hpp"
#include "regex.hpp"
#include "utf8.hpp"

namespace headwise::tokenize {
namespace {

bool is_ascii(const std::string& text) {
  for (unsigned char c : text) {
    if (c >= 0x80) return false;
  }
  return true;
}

const icu::Normalizer2* icu_normalizer(const std::string& form, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = form == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                              : form == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                              : form == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                              : form == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                               : nullptr;
  if (n == nullptr || U_FAILURE(status))
    throw_input_error("{}: ICU has no {} normalizer", where, form);
  return n;
}

class UnicodeForm final : public Normalizer {
 public:
  UnicodeForm(std::string form, const std::string& where)
      : form_(std::move(form)), icu_(icu_normalizer(form_, where)) {}
  void normalize(std::string& text) const override {
    // ASCII is invariant under every normalization form; skipping ICU keeps encode fast.
    if (is_ascii(text)) return;
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString source = icu::UnicodeString::fromUTF8(text);
    if (icu_->isNormalized(source, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    const icu::UnicodeString result = icu_->normalize(source, status);
    HEADWISE_CHECK(U_SUCCESS(status), "ICU {} failed: {}", form_, u_errorName(status));
    text.clear();
    result.toUTF8String(text);
  }

 private:
  std::string form_;
  const icu::Normalizer2* icu_;
};

// Per-character full lowercase mapping without context, like Rust's char::to_lowercase.
class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      const char32_t cp = utf8::next(text, pos);
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        continue;
      }
      UChar in[2], lower[8];
      int32_t in_len = 0;
      U16_APPEND_UNSAFE(in, in_len, cp);
      UErrorCode status = U_ZERO_ERROR;
      const int32_t n = u_strToLower(lower, 8, in, in_len, "", &status);
      icu::UnicodeString(lower, U_SUCCESS(status) ? n : 0).toUTF8String(out);
      if (U_FAILURE(status)) utf8::append(out, cp);
    }
    text.swap(out);
  }
};

class Replace final : public Normalizer {
 public:
  Replace(const nlohmann::json& config, const std::string& where) {
    const auto& pattern = require_field(config, "pattern", where);
    content_ = require_string(config, "content", where);
    if (pattern.contains("String")) {
      literal_ = require_string(pattern, "String", where + ".pattern");
      if (literal_.empty()) throw_input_error("{}.pattern: empty String pattern", where);
    } else if (pattern.contains("Regex")) {
      regex_ = std::make_unique<Regex>(require_string(pattern, "Regex", where + ".pattern"),
                                       where + ".pattern");
    } else {
      throw_input_error("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    }
  }
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    size_t last = 0;
    if (regex_) {
      for (const auto& [begin, end] : regex_->find_all(text)) {
        out.append(text, last, begin - last).append(content_);
        last = end;
      }
    } else {
      for (size_t hit = text.find(literal_); hit != std::string::npos;
           hit = text.find(literal_, last)) {
        out.append(text, last, hit - last).append(content_);
        last = hit + literal_.size();
      }
    }
    out.append(text, last, std::string::npos);
    text.swap(out);
  }

 private:
  std::string literal_, content_;
  std::unique_ptr<Regex> regex_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    while (left_ && begin < end) {
      size_t pos = begin;
      if (!utf8::is_whitespace(utf8::next(text, pos))) break;
      begin = pos;
    }
    while (right_ && end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t pos = start;
      if (!utf8::is_whitespace(utf8::next(text, pos))) break;
      end = start;
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config,
                                            const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = require_string(config, "type", where);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD")
    return std::make_unique<UnicodeForm>(type, where);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Replace") return std::make_unique<Replace>(config, where);
  if (type == "Prepend") return std::make_unique<Prepend>(require_string(config, "prepend", where));
  if (type == "Strip") {
    return std::make_unique<Strip>(config.value("strip_left", true),
                                   config.value("strip_right", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    const auto& list = require_array(config, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto step = make_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i)))
        steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw_unsupported(
      "{}: unsupported normalizer type '{}' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, "
      "Prepend, Strip, Sequence)",
      where, type);
}

std::string unicode_normalize(const std::string& text, const std::string& form) {
  std::string out = text;
  UnicodeForm(form, "unicode_normalize").normalize(out);
  return out;
}

}  // namespace headwise::tokenize
