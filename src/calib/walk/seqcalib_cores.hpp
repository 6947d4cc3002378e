#pragma once
// The attention cores through which SeqCalib measures and decides a global layer inside the
// layer's own pass over the stream.
#include <cstdint>
#include <functional>
#include <vector>

#include "calib/walk/finite_checks.hpp"
#include "calib/walk/seqcalib_run.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/measure/multiwindow.hpp"

namespace headwise::calib::seqcalib {

// Measures every global layer it sees; with `decide` set (single micro-batch), it also
// decides the layer's windows right away and returns the windowed output, saving a second
// pass through the layer.
class MeasuringCore final : public arch::AttentionCore {
 public:
  using DecideFn = std::function<std::vector<int64_t>(int64_t layer_id)>;
  MeasuringCore(const SeqCalibOptions& options, int64_t chunk, Accumulators& accumulators,
                DecideFn decide)
      : options_(options), chunk_(chunk), accumulators_(accumulators), decide_(std::move(decide)) {}

  at::Tensor attend(const arch::AttentionInputs& in) override {
    if (in.sliding_window > 0) return arch::windowed_attention(in, in.sliding_window, 0, chunk_);
    check_heads_finite(in);
    auto [it, inserted] = accumulators_.try_emplace(in.layer_id, in.k.size(1),
                                                    static_cast<int64_t>(options_.ladder.size()));
    at::Tensor full = measure::measure_window_distortion(in, options_.ladder, options_.sink_tokens,
                                                         chunk_, it->second);
    if (!decide_) return full;
    return arch::windowed_attention(in, decide_(in.layer_id), options_.sink_tokens, chunk_);
  }

 private:
  const SeqCalibOptions& options_;
  int64_t chunk_;
  Accumulators& accumulators_;
  DecideFn decide_;
};

// The span measure decides a layer inside the layer's own pass over the stream: its attention
// inputs give the site, the decision gives the windows its output is computed with. One pass
// over the layer instead of a capture pass and a propagation pass (one micro-batch, no state).
class DecidingCore final : public arch::AttentionCore {
 public:
  using Decide = std::function<std::vector<int64_t>(const arch::AttentionInputs&)>;
  DecidingCore(int64_t sinks, int64_t chunk, Decide decide)
      : sinks_(sinks), chunk_(chunk), decide_(std::move(decide)) {}
  at::Tensor attend(const arch::AttentionInputs& in) override {
    return arch::windowed_attention(in, decide_(in), sinks_, chunk_);
  }

 private:
  int64_t sinks_;
  int64_t chunk_;
  Decide decide_;
};

}  // namespace headwise::calib::seqcalib
