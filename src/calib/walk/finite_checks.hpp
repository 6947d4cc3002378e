#pragma once
// NaN/Inf checks of the calibration walk, shared by the measures: they name the KV head or the
// layer where a bad weight first shows, before it spreads into every head's distortion.
#include <ATen/ATen.h>

#include "headwise/arch/model.hpp"

namespace headwise::calib {

// Throws NumericError naming the KV head(s) whose attention inputs (k, v, q, output gate,
// o_proj columns) are NaN/Inf.
void check_heads_finite(const arch::AttentionInputs& in);

// `hidden` when finite; else NumericError naming the layer, sequence, token and channel.
at::Tensor checked_finite(at::Tensor hidden, int64_t layer_id, arch::LayerKind kind);

// Exact attention that first checks every global layer's attention inputs per KV head.
class CheckedExactCore final : public arch::AttentionCore {
 public:
  explicit CheckedExactCore(int64_t chunk) : exact_(chunk) {}
  at::Tensor attend(const arch::AttentionInputs& in) override {
    if (in.sliding_window == 0) check_heads_finite(in);
    return exact_.attend(in);
  }

 private:
  arch::ExactAttentionCore exact_;
};

}  // namespace headwise::calib
