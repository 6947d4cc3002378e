#include "headwise/measure/distortion.hpp"

#include <cmath>
#include <cstring>

#include "headwise/core/error.hpp"

namespace headwise::measure {

DistortionAccumulator::DistortionAccumulator(int64_t num_kv_heads, int64_t num_levels)
    : num_kv_heads_(num_kv_heads),
      num_levels_(num_levels),
      errors_(static_cast<size_t>(num_kv_heads * num_levels)) {
  HEADWISE_CHECK(num_kv_heads > 0 && num_levels > 0, "accumulator of {}x{}", num_kv_heads,
                 num_levels);
}

ExactSum& DistortionAccumulator::error(int64_t head, int64_t level) {
  HEADWISE_CHECK(head >= 0 && head < num_kv_heads_ && level >= 0 && level < num_levels_,
                 "index ({}, {})", head, level);
  return errors_[static_cast<size_t>(head * num_levels_ + level)];
}

const ExactSum& DistortionAccumulator::error(int64_t head, int64_t level) const {
  return const_cast<DistortionAccumulator*>(this)->error(head, level);
}

void DistortionAccumulator::add_error(int64_t head, int64_t level, double squared_error) {
  error(head, level).add(squared_error);
}

void DistortionAccumulator::add_reference(double squared_norm, int64_t tokens) {
  reference_.add(squared_norm);
  tokens_ += tokens;
}

void DistortionAccumulator::merge(const DistortionAccumulator& other) {
  HEADWISE_CHECK(other.num_kv_heads_ == num_kv_heads_ && other.num_levels_ == num_levels_,
                 "merging mismatched accumulators");
  for (size_t i = 0; i < errors_.size(); ++i) errors_[i].merge(other.errors_[i]);
  reference_.merge(other.reference_);
  tokens_ += other.tokens_;
}

std::string DistortionAccumulator::to_bytes() const {
  std::string out;
  for (int64_t v : {num_kv_heads_, num_levels_, tokens_})
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  for (const auto& e : errors_) out += e.to_bytes();
  out += reference_.to_bytes();
  return out;
}

DistortionAccumulator DistortionAccumulator::from_bytes(std::string_view bytes) {
  const size_t sum_bytes = ExactSum().to_bytes().size();
  int64_t header[3] = {};
  if (bytes.size() < sizeof header) throw Error("distortion accumulator: truncated image");
  std::memcpy(header, bytes.data(), sizeof header);
  DistortionAccumulator acc;
  acc.num_kv_heads_ = header[0];
  acc.num_levels_ = header[1];
  acc.tokens_ = header[2];
  const auto sums = static_cast<size_t>(acc.num_kv_heads_ * acc.num_levels_);
  if (acc.num_kv_heads_ < 0 || acc.num_levels_ < 0 ||
      bytes.size() != sizeof header + (sums + 1) * sum_bytes) {
    throw Error("distortion accumulator: malformed image");
  }
  size_t at = sizeof header;
  for (size_t i = 0; i < sums; ++i, at += sum_bytes)
    acc.errors_.push_back(ExactSum::from_bytes(bytes.substr(at, sum_bytes)));
  acc.reference_ = ExactSum::from_bytes(bytes.substr(at, sum_bytes));
  return acc;
}

double DistortionAccumulator::distortion(int64_t head, int64_t level) const {
  const double reference = reference_.value();
  const double err = error(head, level).value();
  // A layer whose block output is exactly zero cannot be hurt by truncation.
  if (reference <= 0.0) return err > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
  return err / reference;
}

std::vector<double> DistortionAccumulator::curve(int64_t head) const {
  std::vector<double> values;
  for (int64_t l = 0; l < num_levels_; ++l) values.push_back(distortion(head, l));
  return values;
}

void DistortionAccumulator::check_finite(int64_t layer_id) const {
  // Heads first: a NaN in one KV head's projections also poisons the block output, and naming
  // the head is what lets a user find the bad weight. Only when every head is bad (or none
  // is, yet the output is) is the layer itself the best answer.
  std::vector<int64_t> bad;
  int64_t first_level = 0;
  for (int64_t h = 0; h < num_kv_heads_; ++h) {
    for (int64_t l = 0; l < num_levels_; ++l) {
      if (!std::isfinite(error(h, l).value())) {
        if (bad.empty()) first_level = l;
        bad.push_back(h);
        break;
      }
    }
  }
  if (!bad.empty() && static_cast<int64_t>(bad.size()) < num_kv_heads_) {
    throw NumericError(
        fmt::format("layer {} KV head {} level {}: distortion is NaN/Inf (bad heads: {})", layer_id,
                    bad.front(), first_level, fmt::join(bad, ",")));
  }
  if (!std::isfinite(reference_.value()) || !bad.empty()) {
    throw NumericError(fmt::format(
        "layer {}: the attention block output is not finite in every KV head (NaN/Inf in "
        "activations or in the layer's weights)",
        layer_id));
  }
}

}  // namespace headwise::measure
