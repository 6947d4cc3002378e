#pragma once
// The grouped cache: a policy materialised for a model with libtorch, allocating exactly the
// bytes memory::estimate computes (tests hold the two equal to the byte).
//
// Global layer: KV heads with the same window form a group sharing one K and one V buffer
//   [batch, heads_in_group, slots, head_dim],  slots = round_up(min(w + S, C), b)
// Ring layout decoding uses (S = sink tokens, R = ring length = min(w, C - S), full: C - S):
//   position p < S            → slot p                   (sinks stay in the first S slots)
//   position p >= S           → slot S + (p - S) mod R   (the last R non-sink positions)
// Slots [S + R, slots) are block-rounding padding and never written. When C <= w + S the
// ring never wraps and slot == position.
// Sliding layer: one K and one V [batch, num_kv_heads, round_up(min(T, C), b), head_dim],
//   T = sliding_cache_tokens; position p → slot p mod min(T, C).
// Recurrent/conv layers: their LayerSpec::states as an arch::LayerState (name → tensor,
//   [batch, shape...]), ready for DecoderModel::run_layer. Falcon-H1 layers hold both.
#include <ATen/ATen.h>

#include <set>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/model_spec.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::runtime {

struct HeadGroup {
  int64_t window = memory::kFullWindow;  // the group's window (kFullWindow = full)
  std::vector<int64_t> kv_heads;         // ascending KV head indices in this group
  int64_t ring_length = 0;               // R above
  at::Tensor k;                          // [batch, heads, slots, head_dim]
  at::Tensor v;
};

struct LayerCache {
  int64_t layer_id = 0;
  arch::LayerKind kind = arch::LayerKind::kMlpOnly;
  std::vector<HeadGroup> groups;  // global layers, ascending window (full last)
  at::Tensor k;                   // sliding layers
  at::Tensor v;
  arch::LayerState states;  // recurrent/conv layers (and Falcon-H1's mamba half)
};

class GroupedCache {
 public:
  // Validates the options and windows (InputError) and allocates zeroed buffers on `device`.
  // Global layers in `evicted` get no head groups (an EvictionCache holds them).
  static GroupedCache allocate(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                               const memory::MemoryOptions& options, at::Device device = at::kCPU,
                               const std::set<int64_t>& evicted = {});

  const memory::MemoryOptions& options() const { return options_; }
  LayerCache& layer(int64_t layer_id);
  const std::vector<LayerCache>& layers() const { return layers_; }

  // Sum of the storage sizes of every tensor held.
  int64_t allocated_bytes() const;
  // CUDA caching-allocator bytes that allocate() added on the device (allocator blocks are
  // rounded to 512 B, so this is >= allocated_bytes()); nullopt on CPU or without CUDA.
  std::optional<int64_t> cuda_allocator_bytes() const { return cuda_allocator_bytes_; }

  // The ring arithmetic above, for decoders.
  static int64_t global_slot(int64_t position, int64_t sink_tokens, int64_t ring_length);
  static int64_t sliding_slot(int64_t position, int64_t cache_tokens);

 private:
  memory::MemoryOptions options_;
  std::vector<LayerCache> layers_;
  std::optional<int64_t> cuda_allocator_bytes_;
};

}  // namespace headwise::runtime
