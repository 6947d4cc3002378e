#pragma once
// An fp64 sum that is exact until the final rounding, so it does not depend on the order of
// its terms nor on how they were split: a sum over micro-batches, merged from any number of
// ranks in any order, rounds to the same double as a single process adding them one by one.
// That is what makes a distributed calibration byte-identical to a single-process one.
//
// A Kulisch-style fixed-point accumulator: every finite double is an integer multiple of 2^-1074
// below 2^1024, so 67 signed 32-bit digits (held in int64, leaving room for 2^31 additions
// between carry passes) represent any sum of them exactly. Written by hand: none of the
// project's libraries offers a reproducible summation, and it is about 100 lines.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace headwise {

class ExactSum {
 public:
  // NaN and infinities are remembered (they make value() NaN/Inf like an ordinary sum would).
  void add(double value);
  void merge(const ExactSum& other);
  // The exact sum, rounded to the nearest double (ties to even).
  double value() const;

  // A canonical byte image (equal sums give equal bytes) for sending between processes, and its
  // inverse; from_bytes throws Error on a malformed image.
  std::string to_bytes() const;
  static ExactSum from_bytes(std::string_view bytes);

  static constexpr int kDigits = 67;  // 32 bits each: 2^-1074 .. 2^1070 and headroom

 private:
  void normalise();  // carries every digit into [0, 2^32) except the top one, which keeps the sign

  std::array<int64_t, kDigits> digits_{};
  int32_t pending_ = 0;  // additions since the last carry pass
  bool nan_ = false;
  int8_t infinity_ = 0;  // -1, 0 or +1 (both signs seen: NaN)
};

}  // namespace headwise
