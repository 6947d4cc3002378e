// The prefill peak of a policy with snap heads. See prefill_peak.hpp.
#include "headwise/memory/prefill_peak.hpp"

#include <algorithm>
#include <map>

#include "checked.hpp"
#include "headwise/core/error.hpp"

namespace headwise::memory {

int64_t snap_staging_bytes_per_token(const arch::AttentionShape& attention,
                                     const MemoryOptions& options) {
  return checked_add(checked_mul(2 * attention.head_dim, element_size(options.kv_dtype)),
                     int64_t{sizeof(float)});
}

PrefillPeak prefill_peak(const arch::ModelSpec& spec, const HeadWindows& windows,
                         const MemoryOptions& options, const std::set<int64_t>& selecting,
                         const SnapHeads& snap_heads, int64_t prompt_tokens) {
  if (prompt_tokens <= 0 || prompt_tokens > options.context) {
    throw_input_error("--prompt-tokens: the prompt must be 1..{} tokens (the context), got {}",
                      options.context, prompt_tokens);
  }
  PrefillPeak p;
  p.prompt_tokens = prompt_tokens;
  p.steady_bytes = estimate(spec, windows, options, selecting).total_bytes;
  std::map<int64_t, int64_t> per_layer;  // staging bytes per token of one sequence
  for (const auto& [layer, head] : snap_heads) {
    if (!selecting.contains(layer) || layer < 0 || layer >= spec.num_layers() ||
        !spec.layer(layer).is_global() || head < 0 ||
        head >= spec.layer(layer).attention->num_kv_heads) {
      throw_input_error("snap head {} of layer {} is not a KV head of a selecting global layer",
                        head, layer);
    }
    per_layer[layer] = checked_add(
        per_layer[layer], snap_staging_bytes_per_token(*spec.layer(layer).attention, options));
  }
  int64_t all = 0, largest = 0;
  for (const auto& [layer, bytes] : per_layer) {
    all = checked_add(all, bytes);
    largest = std::max(largest, bytes);
  }
  p.staging_bytes_per_token = checked_mul(options.batch, all);
  p.whole_staging_bytes = checked_mul(prompt_tokens, p.staging_bytes_per_token);
  p.layer_staging_bytes = checked_mul(prompt_tokens, checked_mul(options.batch, largest));
  p.whole_prompt_peak_bytes = checked_add(p.steady_bytes, p.whole_staging_bytes);
  p.layer_by_layer_peak_bytes = checked_add(p.steady_bytes, p.layer_staging_bytes);
  p.decode_node_bytes = p.steady_bytes;
  MemoryOptions one = options;
  one.batch = 1;
  p.transfer_bytes_per_request = estimate(spec, windows, one, selecting).total_bytes;
  return p;
}

}  // namespace headwise::memory
