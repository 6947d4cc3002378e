#pragma once
// Mergeable distortion statistics for one global layer: for every KV head and window level,
// the summed squared change of the attention block output caused by truncating only that
// head, and the summed squared norm of the untruncated block output. Sums are exact until
// the final rounding (core/exact_sum.hpp), so they merge across micro-batches and ranks to the
// same bits whatever the split.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/core/exact_sum.hpp"

namespace headwise::measure {

class DistortionAccumulator {
 public:
  DistortionAccumulator() = default;
  DistortionAccumulator(int64_t num_kv_heads, int64_t num_levels);

  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t num_levels() const { return num_levels_; }
  int64_t tokens() const { return tokens_; }

  // Squared block-output error of truncating `head` to `level`, summed over some tokens.
  void add_error(int64_t head, int64_t level, double squared_error);
  // Squared norm of the untruncated block output over `tokens` tokens.
  void add_reference(double squared_norm, int64_t tokens);
  void merge(const DistortionAccumulator& other);
  // A byte image for sending to other ranks, and its inverse (Error when malformed).
  std::string to_bytes() const;
  static DistortionAccumulator from_bytes(std::string_view bytes);

  // d[h](w) = mean_t ||Wo_h (a_w - a_full)||^2 / mean_t ||y_full||^2.
  double distortion(int64_t head, int64_t level) const;
  std::vector<double> curve(int64_t head) const;  // one value per level
  // Throws NumericError naming the layer/head when a sum is NaN or Inf.
  void check_finite(int64_t layer_id) const;

 private:
  ExactSum& error(int64_t head, int64_t level);
  const ExactSum& error(int64_t head, int64_t level) const;

  int64_t num_kv_heads_ = 0;
  int64_t num_levels_ = 0;
  int64_t tokens_ = 0;
  std::vector<ExactSum> errors_;  // [head][level]
  ExactSum reference_;
};

}  // namespace headwise::measure
