#include "headwise/memory/tensor_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "headwise/core/error.hpp"

namespace headwise::memory {
namespace {

std::string windows_text(const std::vector<int64_t>& windows) {
  std::string out = "[";
  for (size_t i = 0; i < windows.size(); ++i) {
    if (i) out += ", ";
    out += windows[i] == kFullWindow ? std::string("full") : std::to_string(windows[i]);
  }
  return out + "]";
}

std::vector<int64_t> shard_of(const std::vector<int64_t>& windows,
                              const std::vector<int64_t>& heads) {
  std::vector<int64_t> out;
  for (int64_t h : heads) out.push_back(windows.at(static_cast<size_t>(h)));
  return out;
}

// Sorted with `full` last (kFullWindow may be any sentinel).
std::vector<int64_t> multiset(std::vector<int64_t> w) {
  std::sort(w.begin(), w.end(), [](int64_t a, int64_t b) {
    return std::make_pair(a == kFullWindow, a) < std::make_pair(b == kFullWindow, b);
  });
  return w;
}

}  // namespace

std::vector<std::vector<int64_t>> tensor_parallel_shards(int64_t num_kv_heads,
                                                         int64_t tensor_parallel_size) {
  const int64_t tp = tensor_parallel_size;
  if (tp < 1) throw_input_error("--tensor-parallel-size: must be positive, got {}", tp);
  if (num_kv_heads < 1) throw_input_error("a layer with {} KV heads cannot shard", num_kv_heads);
  std::vector<std::vector<int64_t>> shards(static_cast<size_t>(tp));
  if (num_kv_heads >= tp) {
    if (num_kv_heads % tp != 0) {
      throw_input_error(
          "--tensor-parallel-size {}: {} KV heads do not split over {} ranks (vLLM requires "
          "the KV heads to divide evenly)",
          tp, num_kv_heads, tp);
    }
    const int64_t per = num_kv_heads / tp;
    for (int64_t r = 0; r < tp; ++r)
      for (int64_t h = r * per; h < (r + 1) * per; ++h) shards[static_cast<size_t>(r)].push_back(h);
    return shards;
  }
  if (tp % num_kv_heads != 0) {
    throw_input_error(
        "--tensor-parallel-size {}: {} ranks do not replicate {} KV heads evenly (vLLM requires "
        "the ranks to be a multiple of the KV heads)",
        tp, tp, num_kv_heads);
  }
  const int64_t replicas = tp / num_kv_heads;
  for (int64_t r = 0; r < tp; ++r) shards[static_cast<size_t>(r)].push_back(r / replicas);
  return shards;
}

std::optional<std::string> shard_mismatch(const std::vector<int64_t>& windows,
                                          int64_t tensor_parallel_size) {
  const auto shards =
      tensor_parallel_shards(static_cast<int64_t>(windows.size()), tensor_parallel_size);
  const auto first = shard_of(windows, shards.front());
  for (size_t r = 1; r < shards.size(); ++r) {
    const auto other = shard_of(windows, shards[r]);
    if (multiset(other) != multiset(first)) {
      return fmt::format("rank 0 holds windows {}, rank {} {}", windows_text(first), r,
                         windows_text(other));
    }
  }
  return std::nullopt;
}

std::optional<std::pair<int64_t, std::string>> first_unshardable_layer(
    const HeadWindows& windows, int64_t tensor_parallel_size) {
  for (const auto& [layer, heads] : windows) {
    if (auto why = shard_mismatch(heads, tensor_parallel_size)) return std::make_pair(layer, *why);
  }
  return std::nullopt;
}

arch::ModelSpec shard_model_spec(const arch::ModelSpec& spec, int64_t tensor_parallel_size) {
  const int64_t tp = tensor_parallel_size;
  if (tp < 1) throw_input_error("--tensor-parallel-size: must be positive, got {}", tp);
  arch::ModelSpec out = spec;
  if (tp == 1) return out;
  for (auto& layer : out.layers) {
    if (layer.attention) {
      auto& att = *layer.attention;
      if (att.num_heads % tp != 0) {
        throw_input_error(
            "--tensor-parallel-size {}: layer {} has {} query heads, which do not "
            "split over {} ranks",
            tp, layer.id, att.num_heads, tp);
      }
      const int64_t kv =
          static_cast<int64_t>(tensor_parallel_shards(att.num_kv_heads, tp)[0].size());
      att.num_heads /= tp;
      att.num_kv_heads = kv;
    }
    if (layer.states.empty()) continue;
    if (layer.kind != arch::LayerKind::kLinearAttention) {
      throw_input_error(
          "--tensor-parallel-size {}: layer {} ({}) keeps states whose per-rank shards "
          "mem-estimate does not model (gated-DeltaNet and attention layers only)",
          tp, layer.id, arch::layer_kind_name(layer.kind));
    }
    // Gated DeltaNet (vLLM's gated_delta_net_state_shape): conv state [conv_dim / tp, kernel],
    // recurrent state [num_v_heads / tp, k_dim, v_dim].
    for (auto& state : layer.states) {
      if (state.shape.empty() || state.shape.front() % tp != 0) {
        throw_input_error(
            "--tensor-parallel-size {}: layer {}'s {} (first dimension {}) does not "
            "split over {} ranks",
            tp, layer.id, state.name, state.shape.empty() ? 0 : state.shape.front(), tp);
      }
      state.shape.front() /= tp;
    }
  }
  return out;
}

HeadWindows shard_windows(const HeadWindows& windows, int64_t tensor_parallel_size, int64_t rank) {
  HeadWindows out;
  for (const auto& [layer, heads] : windows) {
    const auto shards =
        tensor_parallel_shards(static_cast<int64_t>(heads.size()), tensor_parallel_size);
    out[layer] = shard_of(heads, shards.at(static_cast<size_t>(rank)));
  }
  return out;
}

}  // namespace headwise::memory
