#include "calib/walk/finite_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "headwise/core/error.hpp"

namespace headwise::calib {

// Names the KV head(s) whose inputs are NaN/Inf: keys and values per KV head; queries, output
// gate and o_proj columns per query head, mapped to their KV head. A bad weight in one head's
// rows poisons every head's measured distortion (they share the block output), so this is
// the only place the head can still be told; a few reductions per global layer.
void check_heads_finite(const arch::AttentionInputs& in) {
  const int64_t kv = in.k.size(1), hq = in.q.size(1), group = hq / kv;
  auto bad_per_head = [](const at::Tensor& t, int64_t head_dim_index) {  // any non-finite per head
    at::Tensor bad = at::logical_not(at::isfinite(t)).movedim(head_dim_index, 0);
    return bad.flatten(1).any(1);
  };
  at::Tensor query_side = bad_per_head(in.q, 1);
  if (in.output_gate.defined()) query_side = query_side | bad_per_head(in.output_gate, 2);
  if (in.o_proj_weight.defined())
    query_side =
        query_side | bad_per_head(in.o_proj_weight.view({in.o_proj_weight.size(0), hq, -1}), 1);
  const at::Tensor bad =
      (bad_per_head(in.k, 1) | bad_per_head(in.v, 1) | query_side.view({kv, group}).any(1)).cpu();
  if (!bad.any().item<bool>()) return;
  std::vector<int64_t> heads;
  for (int64_t h = 0; h < kv; ++h) {
    if (bad[h].item<bool>()) heads.push_back(h);
  }
  throw NumericError(fmt::format(
      "layer {} KV head {}: attention inputs are NaN/Inf (bad KV heads: {}): check that "
      "head's rows of the q/k/v/gate projections and its o_proj columns",
      in.layer_id, heads.front(), fmt::join(heads, ",")));
}

// A NaN/Inf in the hidden states would otherwise surface layers later as a NaN distortion of
// some unrelated head, or silently as garbage curves. One reduction per layer output is cheap
// next to the layer itself.
at::Tensor checked_finite(at::Tensor hidden, int64_t layer_id, arch::LayerKind kind) {
  if (at::isfinite(hidden).all().item<bool>()) return hidden;
  const at::Tensor bad = at::nonzero(at::logical_not(at::isfinite(hidden)))[0].cpu();
  throw NumericError(fmt::format(
      "layer {} ({}): output hidden state is NaN/Inf (first at sequence {}, token {}, channel "
      "{}): check the layer's weights",
      layer_id, layer_kind_name(kind), bad[0].item<int64_t>(), bad[1].item<int64_t>(),
      bad[2].item<int64_t>()));
}

}  // namespace headwise::calib
