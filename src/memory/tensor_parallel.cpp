#include "headwise/memory/tensor_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

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

// vLLM's `divide`: the dimension must split evenly (it asserts; we name the flag and the layer).
int64_t split(int64_t dim, int64_t tp, const arch::LayerSpec& layer, std::string_view what) {
  if (dim % tp != 0) {
    throw_input_error(
        "--tensor-parallel-size {}: layer {}'s {} ({}) does not split over {} ranks (vLLM "
        "requires it to divide evenly)",
        tp, layer.id, what, dim, tp);
  }
  return dim / tp;
}

arch::StateTensorSpec* find_state(arch::LayerSpec& layer, std::string_view name) {
  for (auto& s : layer.states)
    if (s.name == name) return &s;
  return nullptr;
}

// One rank's recurrent states, as vLLM's MambaStateShapeCalculator (mamba_utils.py) shapes them.
// Only the product of a shape matters to the bytes; the first dimension is the one that splits.
//   gated DeltaNet (recurrent_state): conv [conv_dim / tp, K], recurrent [v_heads / tp, ...]
//   Mamba-1 (2-d ssm_state [intermediate, N]): conv [intermediate / tp, K], ssm [.. / tp, N]
//   Mamba-2 (3-d ssm_state [heads, head_dim, N]): heads / tp; groups G (conv_dim = heads x
//     head_dim + 2 G N) split when tp divides them, and a single group is replicated on every
//     rank (extra_groups_for_head_shards: G becomes tp), so conv [(heads x head_dim + 2 G' N) /
//     tp, K]; vLLM's MambaMixer2 refuses any other G
//   short convolution (conv_state alone): conv [conv_dim / tp, K]
void shard_states(arch::LayerSpec& layer, int64_t tp) {
  auto* conv = find_state(layer, "conv_state");
  auto* ssm = find_state(layer, "ssm_state");
  if (ssm != nullptr && ssm->shape.size() == 3 && conv != nullptr && !conv->shape.empty()) {
    const int64_t heads = ssm->shape[0], head_dim = ssm->shape[1], n = ssm->shape[2];
    const int64_t inner = heads * head_dim;
    const int64_t groups = (conv->shape[0] - inner) / (2 * n);
    if (groups < 1 || inner + 2 * groups * n != conv->shape[0]) {
      throw_input_error(
          "--tensor-parallel-size {}: layer {}'s Mamba-2 conv state ({}) is not "
          "heads x head_dim + 2 x groups x state ({} + 2 x G x {})",
          tp, layer.id, conv->shape[0], inner, n);
    }
    if (groups % tp != 0 && groups != 1) {
      throw_input_error(
          "--tensor-parallel-size {}: layer {}'s {} Mamba-2 groups neither split over {} ranks "
          "nor are one group to replicate (vLLM's MambaMixer2 refuses it)",
          tp, layer.id, groups, tp);
    }
    ssm->shape[0] = split(heads, tp, layer, "Mamba-2 heads");
    const int64_t rank_groups = groups % tp == 0 ? groups : tp;
    conv->shape[0] = split(inner + 2 * rank_groups * n, tp, layer, "Mamba-2 conv dimension");
    return;
  }
  // Gated DeltaNet, Mamba-1 and short convolutions: every state's first dimension splits.
  for (auto& state : layer.states) {
    if (state.shape.empty()) {
      throw_input_error("--tensor-parallel-size {}: layer {}'s {} has no dimension to split", tp,
                        layer.id, state.name);
    }
    state.shape.front() = split(state.shape.front(), tp, layer, state.name + " first dimension");
  }
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
    if (!layer.states.empty()) shard_states(layer, tp);
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
