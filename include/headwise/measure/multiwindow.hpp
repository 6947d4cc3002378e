#pragma once
// All window levels of all KV heads in one pass over the keys.
//
// Windows are nested, so each query's keys split into distance bands [0,w1), [w1,w2), ...,
// [w_last, inf) (plus a band for sink tokens). Per band we keep online-softmax partials
// (running max, sum of exponentials, weighted V); the output at level l merges the partials
// of bands 0..l. Every band only touches the keys in its own distance range, so the whole
// ladder costs about one full attention plus O(levels x chunk^2) per query chunk, and the
// workspace is O(chunk x T), never O(T^2).
#include <ATen/ATen.h>

#include <functional>

#include "headwise/arch/model.hpp"
#include "headwise/measure/distortion.hpp"
#include "headwise/measure/window_ladder.hpp"

namespace headwise::measure {

// Called per query chunk [t0, t1) with the per-level outputs (fp32, [B, kv, group, tc, hd],
// one per ladder level) and the untruncated output in the same layout.
using LevelOutputsFn = std::function<void(
    int64_t t0, int64_t t1, const std::vector<at::Tensor>& levels, const at::Tensor& full)>;
void for_each_chunk_levels(const arch::AttentionInputs& inputs, const WindowLadder& ladder,
                           int64_t sink_tokens, int64_t chunk, const LevelOutputsFn& fn);

// Per-level attention outputs [levels, B, T, num_heads, head_dim] in fp32 (for tests and
// small inputs; calibration uses measure_window_distortion).
at::Tensor all_window_outputs(const arch::AttentionInputs& inputs, const WindowLadder& ladder,
                              int64_t sink_tokens, int64_t chunk);

// Accumulates into `acc` (num_kv_heads x ladder levels) the squared change of the block
// output o_proj(gate * a) when only one KV head is truncated, and the squared norm of the
// untruncated block output. Returns the untruncated attention output [B, T, heads, hd] in
// q's dtype.
at::Tensor measure_window_distortion(const arch::AttentionInputs& inputs,
                                     const WindowLadder& ladder, int64_t sink_tokens, int64_t chunk,
                                     DistortionAccumulator& acc);

}  // namespace headwise::measure
