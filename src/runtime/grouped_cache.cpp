#include "headwise/runtime/grouped_cache.hpp"

#include <algorithm>

#include "headwise/core/error.hpp"

#ifdef HEADWISE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace headwise::runtime {
namespace {

at::TensorOptions tensor_options(DType dtype, at::Device device) {
  return at::TensorOptions().dtype(arch::to_scalar_type(dtype)).device(device);
}

// Groups a layer's KV heads by window: ascending windows, full last, heads ascending within.
std::vector<HeadGroup> group_heads(const std::vector<int64_t>& windows) {
  // kFullWindow orders past every finite window, so the map's order is the layout's.
  std::map<int64_t, std::vector<int64_t>> by_window;
  for (size_t h = 0; h < windows.size(); ++h)
    by_window[windows[h]].push_back(static_cast<int64_t>(h));
  std::vector<HeadGroup> groups;
  for (auto& [window, heads] : by_window) {
    HeadGroup g;
    g.window = window;
    g.kv_heads = std::move(heads);
    groups.push_back(std::move(g));
  }
  return groups;
}

void allocate_global(LayerCache& cache, const arch::AttentionShape& att,
                     const std::vector<int64_t>& windows, const memory::MemoryOptions& o,
                     at::Device device) {
  cache.groups = group_heads(windows);
  for (auto& g : cache.groups) {
    const int64_t slots = memory::global_head_slots(g.window, o);
    const int64_t usable = std::max<int64_t>(o.context - o.sink_tokens, 0);
    g.ring_length = g.window == memory::kFullWindow ? usable : std::min(g.window, usable);
    const std::vector<int64_t> shape{o.batch, static_cast<int64_t>(g.kv_heads.size()), slots,
                                     att.head_dim};
    g.k = at::zeros(shape, tensor_options(o.kv_dtype, device));
    g.v = at::zeros(shape, tensor_options(o.kv_dtype, device));
  }
}

void allocate_sliding(LayerCache& cache, const arch::AttentionShape& att,
                      const memory::MemoryOptions& o, at::Device device) {
  const std::vector<int64_t> shape{o.batch, att.num_kv_heads, memory::sliding_layer_slots(att, o),
                                   att.head_dim};
  cache.k = at::zeros(shape, tensor_options(o.kv_dtype, device));
  cache.v = at::zeros(shape, tensor_options(o.kv_dtype, device));
}

void allocate_states(LayerCache& cache, const arch::LayerSpec& layer,
                     const memory::MemoryOptions& o, at::Device device) {
  for (const auto& state : layer.states) {
    std::vector<int64_t> shape{o.batch};
    shape.insert(shape.end(), state.shape.begin(), state.shape.end());
    const DType dtype = o.state_dtype.value_or(state.dtype);
    HEADWISE_CHECK(!cache.states.contains(state.name), "layer {} has two states named {}", layer.id,
                   state.name);
    cache.states[state.name] = at::zeros(shape, tensor_options(dtype, device));
  }
}

int64_t storage_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

#ifdef HEADWISE_WITH_CUDA
int64_t cuda_allocated_now(at::Device device) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}
#endif

}  // namespace

GroupedCache GroupedCache::allocate(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                                    const memory::MemoryOptions& options, at::Device device,
                                    const std::set<int64_t>& evicted) {
  memory::validate_options(options);
  memory::validate_windows(spec, windows);
  GroupedCache cache;
  cache.options_ = options;
#ifdef HEADWISE_WITH_CUDA
  const int64_t before = device.is_cuda() ? cuda_allocated_now(device) : 0;
#endif
  for (const auto& layer : spec.layers) {
    LayerCache lc;
    lc.layer_id = layer.id;
    lc.kind = layer.kind;
    if (layer.is_global() && !evicted.contains(layer.id))
      allocate_global(lc, *layer.attention, windows.at(layer.id), options, device);
    if (layer.is_sliding()) allocate_sliding(lc, *layer.attention, options, device);
    allocate_states(lc, layer, options, device);
    cache.layers_.push_back(std::move(lc));
  }
#ifdef HEADWISE_WITH_CUDA
  if (device.is_cuda()) cache.cuda_allocator_bytes_ = cuda_allocated_now(device) - before;
#endif
  return cache;
}

LayerCache& GroupedCache::layer(int64_t layer_id) {
  HEADWISE_CHECK(layer_id >= 0 && layer_id < static_cast<int64_t>(layers_.size()),
                 "layer {} out of range", layer_id);
  return layers_[static_cast<size_t>(layer_id)];
}

int64_t GroupedCache::allocated_bytes() const {
  int64_t total = 0;
  for (const auto& layer : layers_) {
    for (const auto& g : layer.groups) total += storage_bytes(g.k) + storage_bytes(g.v);
    total += storage_bytes(layer.k) + storage_bytes(layer.v);
    for (const auto& [name, t] : layer.states) total += storage_bytes(t);
  }
  return total;
}

int64_t GroupedCache::global_slot(int64_t position, int64_t sink_tokens, int64_t ring_length) {
  HEADWISE_CHECK(position >= 0, "negative position {}", position);
  if (position < sink_tokens) return position;
  HEADWISE_CHECK(ring_length > 0, "position {} past the sinks of a ring of length 0", position);
  return sink_tokens + (position - sink_tokens) % ring_length;
}

int64_t GroupedCache::sliding_slot(int64_t position, int64_t cache_tokens) {
  HEADWISE_CHECK(position >= 0 && cache_tokens > 0, "bad sliding slot query ({}, {})", position,
                 cache_tokens);
  return position % cache_tokens;
}

}  // namespace headwise::runtime
