#include "headwise/core/exact_sum.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "headwise/core/error.hpp"

namespace headwise {
namespace {

using U128 = unsigned __int128;
constexpr int64_t kDigitMask = 0xffffffffLL;
constexpr int32_t kCarryEvery =
    1 << 30;  // a digit gains < 2^32 per addition: 2^30 of them fit in int64

int bit_length(U128 w) {
  const auto high = static_cast<uint64_t>(w >> 64);
  if (high != 0) return 128 - std::countl_zero(high);
  return 64 - std::countl_zero(static_cast<uint64_t>(w));
}

}  // namespace

void ExactSum::add(double value) {
  if (std::isnan(value)) {
    nan_ = true;
    return;
  }
  if (std::isinf(value)) {
    const int8_t sign = value > 0 ? 1 : -1;
    if (infinity_ != 0 && infinity_ != sign) nan_ = true;
    infinity_ = sign;
    return;
  }
  if (value == 0.0) return;
  const auto bits = std::bit_cast<uint64_t>(value);
  const auto exponent = static_cast<int>((bits >> 52) & 0x7ff);
  uint64_t mantissa = bits & ((uint64_t{1} << 52) - 1);
  // value = mantissa * 2^(position - 1074): subnormals at position 0, normals at exponent - 1.
  int position = 0;
  if (exponent != 0) {
    mantissa |= uint64_t{1} << 52;
    position = exponent - 1;
  }
  const U128 shifted = static_cast<U128>(mantissa) << (position % 32);
  const int digit = position / 32;
  const int64_t sign = (bits >> 63) != 0 ? -1 : 1;
  for (int i = 0; i < 3; ++i) {
    digits_[static_cast<size_t>(digit + i)] +=
        sign * static_cast<int64_t>((shifted >> (32 * i)) & kDigitMask);
  }
  if (++pending_ >= kCarryEvery) normalise();
}

void ExactSum::normalise() {
  int64_t carry = 0;
  for (size_t i = 0; i + 1 < digits_.size(); ++i) {
    const int64_t v = digits_[i] + carry;
    digits_[i] = v & kDigitMask;
    carry = v >> 32;  // arithmetic: floor division, so the digit left behind is in [0, 2^32)
  }
  digits_.back() += carry;
  pending_ = 0;
}

void ExactSum::merge(const ExactSum& other) {
  ExactSum o = other;
  o.normalise();
  normalise();
  for (size_t i = 0; i < digits_.size(); ++i) digits_[i] += o.digits_[i];
  pending_ = 1;
  nan_ = nan_ || o.nan_ || (infinity_ != 0 && o.infinity_ != 0 && infinity_ != o.infinity_);
  if (o.infinity_ != 0) infinity_ = o.infinity_;
}

double ExactSum::value() const {
  if (nan_) return std::numeric_limits<double>::quiet_NaN();
  if (infinity_ != 0) return infinity_ * std::numeric_limits<double>::infinity();
  ExactSum s = *this;
  s.normalise();
  const bool negative = s.digits_.back() < 0;
  if (negative) {
    for (auto& d : s.digits_) d = -d;
    s.normalise();
  }
  int top = ExactSum::kDigits - 1;
  while (top >= 0 && s.digits_[static_cast<size_t>(top)] == 0) --top;
  if (top < 0) return 0.0;
  // The top three digits (65..96 significant bits once there are more) and whether anything
  // below them is non-zero decide the rounding to 53 bits.
  const int low = std::max(top - 2, 0);
  U128 w = 0;
  for (int i = top; i >= low; --i)
    w = (w << 32) | static_cast<U128>(s.digits_[static_cast<size_t>(i)]);
  bool sticky = false;
  for (int i = 0; i < low; ++i) sticky = sticky || s.digits_[static_cast<size_t>(i)] != 0;
  int exponent = 32 * low - 1074;
  const int bits = bit_length(w);
  if (bits > 53) {
    const int shift = bits - 53;
    const U128 kept = w >> shift;
    const U128 rest = w & ((U128{1} << shift) - 1);
    const U128 half = U128{1} << (shift - 1);
    const bool up = rest > half || (rest == half && (sticky || (kept & 1) != 0));
    w = kept + (up ? 1 : 0);
    exponent += shift;
  }
  const double magnitude = std::ldexp(static_cast<double>(static_cast<uint64_t>(w)), exponent);
  return negative ? -magnitude : magnitude;
}

std::string ExactSum::to_bytes() const {
  ExactSum s = *this;
  s.normalise();
  std::string out(sizeof(int64_t) * digits_.size() + 2, '\0');
  std::memcpy(out.data(), s.digits_.data(), sizeof(int64_t) * digits_.size());
  out[out.size() - 2] = static_cast<char>(nan_ ? 1 : 0);
  out[out.size() - 1] = static_cast<char>(infinity_);
  return out;
}

ExactSum ExactSum::from_bytes(std::string_view bytes) {
  ExactSum s;
  if (bytes.size() != sizeof(int64_t) * s.digits_.size() + 2) {
    throw Error(fmt::format("exact sum: {} bytes, expected {}", bytes.size(),
                            sizeof(int64_t) * s.digits_.size() + 2));
  }
  std::memcpy(s.digits_.data(), bytes.data(), sizeof(int64_t) * s.digits_.size());
  s.nan_ = bytes[bytes.size() - 2] != 0;
  s.infinity_ = static_cast<int8_t>(bytes[bytes.size() - 1]);
  s.pending_ = 1;
  return s;
}

}  // namespace headwise
