// EvictionCache: the pools and region table, and the selection rules. See eviction_cache.hpp.
#include "headwise/runtime/eviction_cache.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "headwise/core/error.hpp"

namespace headwise::runtime {
namespace {

int64_t storage_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

// Regions at the capacities, back to back, empty.
void reset_regions(EvictionLayer& l, int64_t batch) {
  std::vector<int64_t> offsets(l.capacity.size(), 0);
  std::exclusive_scan(l.capacity.begin(), l.capacity.end(), offsets.begin(), int64_t{0});
  l.offset.assign(static_cast<size_t>(batch), offsets);
  l.length.assign(static_cast<size_t>(batch), l.capacity);
  l.held.assign(static_cast<size_t>(batch), std::vector<int64_t>(l.capacity.size(), 0));
}

}  // namespace

void drop_staging(EvictionLayer& l) {
  l.staged_k = at::Tensor();
  l.staged_v = at::Tensor();
  l.observed_q = at::Tensor();
  l.staged_begin = 0;
  for (auto& received : l.snap_received) {
    for (auto& r : received) r = at::Tensor();
  }
}

std::string eviction_method_name(EvictionMethod method) {
  switch (method) {
    case EvictionMethod::kSnapKV:
      return "snapkv";
    case EvictionMethod::kH2O:
      return "h2o";
    case EvictionMethod::kAdaKV:
      return "adakv";
  }
  return "?";
}

std::string eviction_name(const EvictionOptions& options) {
  const bool chunked =
      options.method != EvictionMethod::kH2O && options.prefill == EvictionPrefill::kEachChunk;
  return eviction_method_name(options.method) + (chunked ? "-chunked" : "");
}

std::string pooling_name(ScorePooling pooling) {
  return pooling == ScorePooling::kMax ? "max" : "avg";
}

void validate_eviction_options(const EvictionOptions& o) {
  const std::string name = eviction_name(o);
  if (o.observation_window <= 0) {
    throw_input_error("{}: the observation window must be positive, got {}", name,
                      o.observation_window);
  }
  if (o.pooling_kernel <= 0 || o.pooling_kernel % 2 == 0) {
    throw_input_error(
        "{}: the pooling kernel must be a positive odd number (it keeps positions aligned), got {}",
        name, o.pooling_kernel);
  }
  if (!(o.adakv_floor >= 0.0 && o.adakv_floor <= 1.0)) {
    throw_input_error("{}: the AdaKV floor must be a share in [0, 1], got {}", name, o.adakv_floor);
  }
  if (!o.window_heads.empty() && o.method != EvictionMethod::kH2O) {
    throw_input_error(
        "{}: window heads mix only with h2o (SnapKV/AdaKV choose over every head of a layer at "
        "once)",
        name);
  }
  if (!o.snap_heads.empty() && o.method != EvictionMethod::kH2O) {
    throw_input_error("{}: snap heads mix only with window and h2o heads", name);
  }
  for (const auto& head : o.snap_heads) {
    if (o.window_heads.contains(head)) {
      throw_input_error("{}: head {} of layer {} is both a window head and a snap head", name,
                        head.second, head.first);
    }
  }
}

namespace {

// One global layer's pools: exactly the grouped cache's slots per head, the same bytes spent on
// chosen tokens; a head in `eviction.window_heads` keeps its window.
EvictionLayer make_layer(const arch::LayerSpec& spec, const std::vector<int64_t>& windows,
                         const memory::MemoryOptions& options, const EvictionOptions& eviction,
                         at::Device device) {
  const auto& att = *spec.attention;
  const auto kv = at::TensorOptions().dtype(arch::to_scalar_type(options.kv_dtype)).device(device);
  EvictionLayer l;
  l.layer_id = spec.id;
  l.num_kv_heads = att.num_kv_heads;
  for (size_t h = 0; h < windows.size(); ++h) {
    const int64_t w = windows[h];
    l.capacity.push_back(memory::global_head_slots(w, options));
    l.window.push_back(eviction.window_heads.contains({spec.id, static_cast<int64_t>(h)}) ? w : 0);
    const bool snap = eviction.snap_heads.contains({spec.id, static_cast<int64_t>(h)});
    l.snap_index.push_back(snap ? l.num_snap_heads++ : -1);
  }
  l.snap_received.assign(static_cast<size_t>(options.batch),
                         std::vector<at::Tensor>(static_cast<size_t>(l.num_snap_heads)));
  const int64_t slots = std::accumulate(l.capacity.begin(), l.capacity.end(), int64_t{0});
  l.k = at::zeros({options.batch, slots, att.head_dim}, kv);
  l.v = at::zeros({options.batch, slots, att.head_dim}, kv);
  l.position = at::full({options.batch, slots}, -1, kv.dtype(at::kLong));
  l.score = at::zeros({options.batch, slots}, kv.dtype(at::kFloat));
  reset_regions(l, options.batch);
  return l;
}

}  // namespace

std::set<int64_t> evicted_layers(const arch::ModelSpec& spec, const EvictionOptions& options) {
  const auto global = spec.global_layer_ids();
  for (int64_t id : options.layers) {
    if (std::find(global.begin(), global.end(), id) == global.end()) {
      throw_input_error("{}: layer {} is not a global layer (global layers: {})",
                        eviction_name(options), id, fmt::join(global, ", "));
    }
  }
  if (!options.layers.empty()) return options.layers;
  return {global.begin(), global.end()};
}

void EvictionCache::check_window_heads() const {
  for (const auto* heads : {&eviction_.window_heads, &eviction_.snap_heads}) {
    for (const auto& [layer, head] : *heads) {
      const auto it = layers_.find(layer);
      if (it == layers_.end() || head < 0 || head >= it->second.num_kv_heads) {
        throw_input_error("{}: {} head {} of layer {} is not a KV head of a global layer",
                          eviction_name(eviction_),
                          heads == &eviction_.window_heads ? "window" : "snap", head, layer);
      }
    }
  }
}

EvictionCache EvictionCache::allocate(const arch::ModelSpec& spec,
                                      const memory::HeadWindows& windows,
                                      const memory::MemoryOptions& options,
                                      const EvictionOptions& eviction, at::Device device) {
  memory::validate_options(options);
  memory::validate_windows(spec, windows);
  validate_eviction_options(eviction);
  EvictionCache cache;
  cache.options_ = options;
  cache.eviction_ = eviction;
  for (int64_t id : evicted_layers(spec, eviction)) {
    cache.layers_.emplace(id,
                          make_layer(spec.layer(id), windows.at(id), options, eviction, device));
  }
  cache.check_window_heads();
  return cache;
}

EvictionCache EvictionCache::allocate_layer(const arch::ModelSpec& spec, int64_t layer_id,
                                            const std::vector<int64_t>& windows,
                                            const memory::MemoryOptions& options,
                                            const EvictionOptions& eviction, at::Device device) {
  memory::validate_options(options);
  HEADWISE_CHECK(layer_id >= 0 && layer_id < spec.num_layers() && spec.layer(layer_id).is_global(),
                 "layer {} is not a global layer", layer_id);
  HEADWISE_CHECK(
      static_cast<int64_t>(windows.size()) == spec.layer(layer_id).attention->num_kv_heads,
      "layer {}: {} windows for {} KV heads", layer_id, windows.size(),
      spec.layer(layer_id).attention->num_kv_heads);
  for (int64_t w : windows) HEADWISE_CHECK(w > 0, "layer {}: window {}", layer_id, w);
  validate_eviction_options(eviction);
  EvictionCache cache;
  cache.options_ = options;
  cache.eviction_ = eviction;
  cache.layers_.emplace(layer_id,
                        make_layer(spec.layer(layer_id), windows, options, eviction, device));
  cache.check_window_heads();
  return cache;
}

EvictionLayer& EvictionCache::layer(int64_t layer_id) {
  const auto it = layers_.find(layer_id);
  HEADWISE_CHECK(it != layers_.end(), "layer {} is not a global layer of the eviction cache",
                 layer_id);
  return it->second;
}

int64_t EvictionCache::kv_bytes() const {
  int64_t total = 0;
  for (const auto& [id, l] : layers_) total += storage_bytes(l.k) + storage_bytes(l.v);
  return total;
}

int64_t EvictionCache::auxiliary_bytes() const {
  int64_t total = 0;
  for (const auto& [id, l] : layers_) {
    total += storage_bytes(l.position) + storage_bytes(l.score);
    // offset, length, held: one int64 each per sequence and head.
    total += 3 * static_cast<int64_t>(sizeof(int64_t)) * options_.batch * l.num_kv_heads;
  }
  return total;
}

int64_t EvictionCache::staged_bytes() const {
  int64_t total = 0;
  for (const auto& [id, l] : layers_) {
    total += storage_bytes(l.staged_k) + storage_bytes(l.staged_v) + storage_bytes(l.observed_q);
    for (const auto& received : l.snap_received) {
      for (const auto& r : received) total += storage_bytes(r);
    }
  }
  return total;
}

void EvictionCache::reset() {
  for (auto& [id, l] : layers_) {
    l.k.zero_();
    l.v.zero_();
    l.position.fill_(-1);
    l.score.zero_();
    reset_regions(l, options_.batch);
    drop_staging(l);
    l.snap_ring = 0;
  }
}

std::vector<int64_t> EvictionCache::held_positions(int64_t layer_id, int64_t b,
                                                   int64_t head) const {
  const auto it = layers_.find(layer_id);
  HEADWISE_CHECK(it != layers_.end(), "layer {} is not a global layer of the eviction cache",
                 layer_id);
  const auto& l = it->second;
  const auto bi = static_cast<size_t>(b), hi = static_cast<size_t>(head);
  const at::Tensor pos = l.position[b]
                             .narrow(0, l.offset.at(bi).at(hi), l.held.at(bi).at(hi))
                             .to(at::kCPU)
                             .contiguous();
  std::vector<int64_t> out(pos.data_ptr<int64_t>(), pos.data_ptr<int64_t>() + pos.numel());
  std::sort(out.begin(), out.end());
  return out;
}

int64_t EvictionCache::region_length(int64_t layer_id, int64_t b, int64_t head) const {
  const auto it = layers_.find(layer_id);
  HEADWISE_CHECK(it != layers_.end(), "layer {} is not a global layer of the eviction cache",
                 layer_id);
  return it->second.length.at(static_cast<size_t>(b)).at(static_cast<size_t>(head));
}

at::Tensor keep_indices(const at::Tensor& position, const at::Tensor& score, int64_t keep,
                        int64_t recent) {
  HEADWISE_CHECK(position.dim() == 1 && score.sizes() == position.sizes(),
                 "keep_indices: positions {} scores {}", arch::shape_string(position.sizes()),
                 arch::shape_string(score.sizes()));
  HEADWISE_CHECK(keep >= 0 && recent >= 0 && recent <= keep, "keep_indices: keep {} recent {}",
                 keep, recent);
  const int64_t n = position.size(0);
  const auto ascending = [&](const at::Tensor& idx) {
    return idx.index_select(
        0, std::get<1>(at::sort(position.index_select(0, idx), /*stable=*/true, 0, false)));
  };
  if (n <= keep) return ascending(at::arange(n, position.options()));
  // Most recent first: the recent window is a prefix, and the stable score sort below then
  // breaks ties toward the more recent position.
  const at::Tensor by_recency =
      std::get<1>(at::sort(position, /*stable=*/true, 0, /*descending=*/true));
  const at::Tensor rest = by_recency.slice(0, recent);
  const at::Tensor order =
      std::get<1>(at::sort(score.index_select(0, rest), /*stable=*/true, 0, /*descending=*/true));
  const at::Tensor kept = at::cat(
      {by_recency.slice(0, 0, recent), rest.index_select(0, order.slice(0, 0, keep - recent))});
  return ascending(kept);
}

at::Tensor snap_keep_indices(const at::Tensor& position, const at::Tensor& primary,
                             const at::Tensor& secondary, int64_t keep) {
  HEADWISE_CHECK(position.dim() == 1 && primary.sizes() == position.sizes() &&
                     secondary.sizes() == position.sizes() && keep >= 0,
                 "snap_keep_indices: positions {} scores {} {} keep {}",
                 arch::shape_string(position.sizes()), arch::shape_string(primary.sizes()),
                 arch::shape_string(secondary.sizes()), keep);
  const int64_t n = position.size(0);
  // Ascending by position, then stable sorts from the weakest key to the strongest.
  at::Tensor order = std::get<1>(at::sort(position, /*stable=*/true, 0, /*descending=*/false));
  if (n > keep) {
    order = order.index_select(
        0, std::get<1>(at::sort(secondary.index_select(0, order), true, 0, true)));
    order =
        order.index_select(0, std::get<1>(at::sort(primary.index_select(0, order), true, 0, true)));
    order = order.slice(0, 0, keep);
  }
  return order.index_select(
      0, std::get<1>(at::sort(position.index_select(0, order), /*stable=*/true, 0, false)));
}

at::Tensor pool_scores(const at::Tensor& score, int64_t kernel, ScorePooling pooling) {
  HEADWISE_CHECK(score.dim() == 1 && kernel > 0 && kernel % 2 == 1,
                 "pool_scores: scores {} kernel {}", arch::shape_string(score.sizes()), kernel);
  if (score.size(0) == 0 || kernel == 1) return score.to(at::kFloat);
  const at::Tensor x = score.to(at::kFloat).view({1, 1, -1});
  const int64_t pad = kernel / 2;
  const at::Tensor pooled = pooling == ScorePooling::kMax
                                ? at::max_pool1d(x, {kernel}, {1}, {pad})
                                : at::avg_pool1d(x, {kernel}, {1}, {pad}, /*ceil_mode=*/false,
                                                 /*count_include_pad=*/true);
  return pooled.view({-1});
}

std::vector<int64_t> adakv_budgets(const std::vector<at::Tensor>& scores,
                                   const std::vector<at::Tensor>& positions, int64_t total,
                                   int64_t floor) {
  HEADWISE_CHECK(scores.size() == positions.size() && total >= 0 && floor >= 0,
                 "adakv_budgets: {} scores, {} positions", scores.size(), positions.size());
  const size_t heads = scores.size();
  std::vector<int64_t> budget(heads, 0);
  std::vector<at::Tensor> rest_score, rest_position, rest_head;
  int64_t floors = 0;
  for (size_t h = 0; h < heads; ++h) {
    const at::Tensor s = scores[h].to(at::kCPU, at::kDouble),
                     p = positions[h].to(at::kCPU, at::kLong);
    HEADWISE_CHECK(s.dim() == 1 && s.sizes() == p.sizes(),
                   "adakv_budgets: head {} scores {} positions {}", h,
                   arch::shape_string(s.sizes()), arch::shape_string(p.sizes()));
    // The head's own order (score, then recency): its floor is its best entries, the rest compete.
    const at::Tensor by_recency = std::get<1>(at::sort(p, /*stable=*/true, 0, /*descending=*/true));
    const at::Tensor order = by_recency.index_select(
        0, std::get<1>(at::sort(s.index_select(0, by_recency), true, 0, true)));
    budget[h] = std::min(floor, s.size(0));
    floors += budget[h];
    const at::Tensor rest = order.slice(0, budget[h]);
    rest_score.push_back(s.index_select(0, rest));
    rest_position.push_back(p.index_select(0, rest));
    rest_head.push_back(at::full({rest.size(0)}, static_cast<int64_t>(h), at::kLong));
  }
  HEADWISE_CHECK(floors <= total, "AdaKV floors {} exceed the budget {}", floors, total);
  const int64_t remaining = std::max<int64_t>(total - floors, 0);
  if (heads == 0 || remaining == 0) return budget;
  // Flattened over the layer: lower head, then more recent position, then higher score —
  // applied as stable sorts from the weakest key to the strongest.
  const at::Tensor s = at::cat(rest_score), p = at::cat(rest_position), hd = at::cat(rest_head);
  at::Tensor order = at::arange(s.size(0), at::kLong);  // already by head ascending
  order = order.index_select(0, std::get<1>(at::sort(p.index_select(0, order), true, 0, true)));
  order = order.index_select(0, std::get<1>(at::sort(s.index_select(0, order), true, 0, true)));
  const at::Tensor chosen = hd.index_select(0, order.slice(0, 0, remaining)).contiguous();
  for (int64_t i = 0; i < chosen.size(0); ++i)
    ++budget[static_cast<size_t>(chosen.data_ptr<int64_t>()[i])];
  return budget;
}

}  // namespace headwise::runtime
