#include "headwise/memory/vllm_model.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "checked.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"

#ifndef HEADWISE_VLLM_RULES_VERSION
#error "HEADWISE_VLLM_RULES_VERSION comes from versions.env (VLLM_RULES_VERSION) through CMake"
#endif

namespace headwise::memory {
namespace {

// vLLM's FlashAttention backends take kernel blocks in multiples of 16 tokens; the hybrid
// alignment never picks a block below max(16, --block-size).
constexpr int64_t kKernelBlockAlignment = 16;
// ModelConfig.get_mamba_chunk_size: configs without mamba_chunk_size / chunk_size use 2048.
constexpr int64_t kDefaultMambaChunkSize = 2048;

// K and V of one token of `heads` heads: the attention page at block size 1.
int64_t attention_bytes_per_token(int64_t heads, int64_t head_dim, const MemoryOptions& o) {
  return checked_mul(checked_mul(2 * heads, head_dim), element_size(o.kv_dtype));
}

// vLLM's MambaSpec page: its state tensors for one sequence. Conv states keep kernel - 1 inputs
// (MambaStateShapeCalculator: conv_kernel - 1) at mamba_cache_dtype ("auto" = the model dtype);
// the other states follow mamba_ssm_cache_dtype (--state-dtype; "auto" = the model dtype).
int64_t vllm_state_page_bytes(const arch::LayerSpec& layer, DType model_dtype,
                              const MemoryOptions& o) {
  int64_t page = 0;
  for (const auto& state : layer.states) {
    const bool conv = state.name == "conv_state";
    int64_t n = element_size(conv ? model_dtype : o.state_dtype.value_or(model_dtype));
    for (size_t d = 0; d < state.shape.size(); ++d) {
      const bool kernel_dim = conv && d + 1 == state.shape.size();
      n = checked_mul(n, kernel_dim ? state.shape[d] - 1 : state.shape[d]);
    }
    page = checked_add(page, n);
  }
  return page;
}

bool has_mamba_states(const arch::ModelSpec& spec) {
  return std::any_of(spec.layers.begin(), spec.layers.end(),
                     [](const auto& l) { return !l.states.empty(); });
}

// model_config.get_num_kv_heads / get_head_size: the model-level attention shape, which the
// hybrid block-size alignment uses even where a layer (or a head group) is smaller.
const arch::AttentionShape* model_attention(const arch::ModelSpec& spec) {
  for (const auto& layer : spec.layers) {
    if (layer.attention) return &*layer.attention;
  }
  return nullptr;
}

int64_t largest_state_page(const arch::ModelSpec& spec, const MemoryOptions& o) {
  int64_t page = 0;
  for (const auto& layer : spec.layers)
    page = std::max(page, vllm_state_page_bytes(layer, spec.dtype, o));
  return page;
}

int64_t mamba_chunk_size(const arch::ModelSpec& spec) {
  for (const char* key : {"mamba_chunk_size", "chunk_size"}) {
    if (spec.text_config.contains(key) && spec.text_config.at(key).is_number_integer()) {
      return spec.text_config.at(key).get<int64_t>();
    }
  }
  return kDefaultMambaChunkSize;
}

// Mamba pages under mamba_cache_mode "all" cover one chunk-aligned block of tokens each.
int64_t mamba_block_size(const arch::ModelSpec& spec, const MemoryOptions& o,
                         const VllmOptions& v) {
  const arch::AttentionShape* att = model_attention(spec);
  if (att == nullptr || v.mamba_cache_mode != MambaCacheMode::kAll) return o.context;
  const int64_t per_token = attention_bytes_per_token(att->num_kv_heads, att->head_dim, o);
  const int64_t alignment = std::max(kKernelBlockAlignment, o.block_size);
  const int64_t chunk = std::lcm(mamba_chunk_size(spec), alignment);
  return chunk * ceil_div(ceil_div(largest_state_page(spec, o), per_token), chunk);
}

// The specs of one layer, before page unification.
void append_layer_specs(const arch::LayerSpec& layer, const HeadWindows& windows, DType model_dtype,
                        const MemoryOptions& o, std::vector<VllmSpec>& out) {
  if (layer.attention) {
    const auto& att = *layer.attention;
    VllmSpec base;
    base.layer_id = layer.id;
    base.head_dim = att.head_dim;
    if (layer.is_sliding()) {
      base.kind = VllmSpecKind::kSlidingWindow;
      base.num_kv_heads = att.num_kv_heads;
      base.window = att.sliding_window;
      out.push_back(base);
    } else {
      // One spec per window class, in order of first appearance among the heads.
      base.global_layer = true;
      std::vector<std::pair<int64_t, int64_t>> classes;  // window → heads
      for (int64_t w : windows.at(layer.id)) {
        auto it = std::find_if(classes.begin(), classes.end(),
                               [w](const auto& c) { return c.first == w; });
        if (it == classes.end())
          classes.emplace_back(w, 1);
        else
          ++it->second;
      }
      for (const auto& [w, heads] : classes) {
        VllmSpec s = base;
        s.kind = w == kFullWindow ? VllmSpecKind::kFullAttention : VllmSpecKind::kSlidingWindow;
        s.window = w == kFullWindow ? 0 : w;
        s.num_kv_heads = heads;
        out.push_back(s);
      }
    }
  }
  if (!layer.states.empty()) {
    VllmSpec s;
    s.kind = VllmSpecKind::kMamba;
    s.layer_id = layer.id;
    s.state_bytes = vllm_state_page_bytes(layer, model_dtype, o);
    s.state_class = layer.states.front().state_class;
    out.push_back(s);
  }
}

// The unpadded page of a spec at `block_size` tokens per block.
int64_t natural_page_bytes(const VllmSpec& s, int64_t block_size, const MemoryOptions& o) {
  if (s.kind == VllmSpecKind::kMamba) return s.state_bytes;
  return checked_mul(block_size, attention_bytes_per_token(s.num_kv_heads, s.head_dim, o));
}

// UniformTypeKVCacheSpecs.is_uniform_type: one kind (and one window) with one block size.
bool uniform_type(const std::vector<VllmSpec>& specs) {
  return std::all_of(specs.begin(), specs.end(), [&](const VllmSpec& s) {
    return s.kind == specs.front().kind && s.window == specs.front().window &&
           s.block_size == specs.front().block_size;
  });
}

// unify_kv_cache_spec_page_size: every page becomes the largest one. A page dividing it grows
// its block size by the ratio (same bytes per token, coarser rounding); any other is padded.
void unify_pages(std::vector<VllmSpec>& specs, int64_t block_size, int64_t mamba_page,
                 const MemoryOptions& o) {
  int64_t largest = 0;
  for (auto& s : specs) {
    s.block_size = block_size;
    s.unpadded_page_bytes = natural_page_bytes(s, block_size, o);
    // Hybrid models pad the Mamba page to the attention page (mamba_page_size_padded).
    s.page_bytes = s.kind == VllmSpecKind::kMamba ? std::max(mamba_page, s.unpadded_page_bytes)
                                                  : s.unpadded_page_bytes;
    largest = std::max(largest, s.page_bytes);
  }
  // get_kv_cache_groups takes one-type models (UniformTypeKVCacheSpecs) before unifying pages.
  if (uniform_type(specs)) return;
  for (auto& s : specs) {
    if (s.page_bytes == largest) continue;
    if (largest % s.page_bytes == 0) {
      s.block_size = checked_mul(s.block_size, largest / s.page_bytes);
      s.unpadded_page_bytes = natural_page_bytes(s, s.block_size, o);
    }
    s.page_bytes = largest;
  }
}

// Specs vLLM regards as equal (one "type" of the grouping).
auto spec_key(const VllmSpec& s) {
  return std::make_tuple(static_cast<int>(s.kind), s.num_kv_heads, s.head_dim, s.window,
                         s.state_bytes, s.block_size, s.page_bytes);
}

// _get_kv_cache_groups_uniform_page_size: types in order of first appearance, each split into
// cdiv(n, g) groups taking every cdiv(n, g)-th spec (layers[i::num_groups]).
std::pair<int64_t, std::vector<VllmGroup>> group_specs(const std::vector<VllmSpec>& specs) {
  std::vector<std::vector<int64_t>> types;
  std::map<decltype(spec_key(specs.front())), size_t> type_of;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto [it, added] = type_of.emplace(spec_key(specs[i]), types.size());
    if (added) types.emplace_back();
    types[it->second].push_back(static_cast<int64_t>(i));
  }
  if (types.size() == 1 || uniform_type(specs)) {
    // One group; every layer keeps its own pages, no padding slots.
    VllmGroup all;
    all.specs.resize(specs.size());
    std::iota(all.specs.begin(), all.specs.end(), 0);
    return {static_cast<int64_t>(specs.size()), {all}};
  }
  size_t smallest = types.front().size(), largest = 0;
  for (const auto& t : types) {
    smallest = std::min(smallest, t.size());
    largest = std::max(largest, t.size());
  }
  // vLLM: "max_num_layers < min_num_layers * 1.5" (in integers: 2 * max < 3 * min).
  const size_t group_size = 2 * largest < 3 * smallest ? largest : smallest;
  std::vector<VllmGroup> groups;
  for (const auto& t : types) {
    const size_t num_groups = (t.size() + group_size - 1) / group_size;
    for (size_t g = 0; g < num_groups; ++g) {
      VllmGroup group;
      for (size_t i = g; i < t.size(); i += num_groups) group.specs.push_back(t[i]);
      group.padding_slots = static_cast<int64_t>(group_size - group.specs.size());
      groups.push_back(std::move(group));
    }
  }
  return {static_cast<int64_t>(group_size), groups};
}

}  // namespace

std::string_view vllm_rules_version() {
  return HEADWISE_VLLM_RULES_VERSION;
}

std::string_view mamba_cache_mode_name(MambaCacheMode mode) {
  switch (mode) {
    case MambaCacheMode::kNone:
      return "none";
    case MambaCacheMode::kAlign:
      return "align";
    case MambaCacheMode::kAll:
      return "all";
  }
  HEADWISE_CHECK(false, "unknown mamba cache mode");
}

MambaCacheMode parse_mamba_cache_mode(std::string_view text) {
  for (MambaCacheMode m : {MambaCacheMode::kNone, MambaCacheMode::kAlign, MambaCacheMode::kAll}) {
    if (text == mamba_cache_mode_name(m)) return m;
  }
  throw_field_error("mamba_cache_mode",
                    ": expected none, align or all (vLLM's mamba_cache_mode), got '{}'", text);
}

std::string_view vllm_spec_kind_name(VllmSpecKind kind) {
  switch (kind) {
    case VllmSpecKind::kFullAttention:
      return "full_attention";
    case VllmSpecKind::kSlidingWindow:
      return "sliding_window";
    case VllmSpecKind::kMamba:
      return "mamba";
  }
  HEADWISE_CHECK(false, "unknown vLLM spec kind");
}

void validate_vllm_options(const VllmOptions& v) {
  if (v.max_num_batched_tokens <= 0) {
    throw_field_error("max_num_batched_tokens", ": must be a positive number of tokens, got {}",
                      v.max_num_batched_tokens);
  }
  if (v.in_flight_batches <= 0) {
    throw_field_error("in_flight_batches", ": must be a positive number of batches, got {}",
                      v.in_flight_batches);
  }
}

int64_t vllm_block_size(const arch::ModelSpec& spec, const MemoryOptions& o, const VllmOptions& v) {
  validate_options(o);
  validate_vllm_options(v);
  const arch::AttentionShape* att = model_attention(spec);
  if (att == nullptr || !has_mamba_states(spec)) return o.block_size;
  const int64_t per_token = attention_bytes_per_token(att->num_kv_heads, att->head_dim, o);
  const int64_t alignment = std::max(kKernelBlockAlignment, o.block_size);
  // Without "all": the smallest aligned block whose attention page holds a Mamba page.
  const int64_t needed =
      v.mamba_cache_mode == MambaCacheMode::kAll
          ? mamba_block_size(spec, o, v)
          : alignment * ceil_div(largest_state_page(spec, o), checked_mul(alignment, per_token));
  return std::max(o.block_size, needed);
}

int64_t vllm_pages_per_request(const VllmSpec& s, const MemoryOptions& o, const VllmOptions& v) {
  validate_options(o);
  validate_vllm_options(v);
  if (s.block_size <= 0)
    throw_field_error("block_size", ": a vLLM spec needs a positive block size, got {}",
                      s.block_size);
  switch (s.kind) {
    case VllmSpecKind::kFullAttention:
      return ceil_div(o.context, s.block_size);
    case VllmSpecKind::kSlidingWindow: {
      if (s.window <= 0)
        throw_input_error("layer {}: sliding window must be positive, got {}", s.layer_id,
                          s.window);
      const int64_t tokens = std::min(
          checked_add(s.window - 1, checked_mul(v.in_flight_batches, v.max_num_batched_tokens)),
          o.context);
      return ceil_div(tokens, s.block_size) + 1;
    }
    case VllmSpecKind::kMamba:
      switch (v.mamba_cache_mode) {
        case MambaCacheMode::kNone:
          return 1;
        case MambaCacheMode::kAlign:
          return 2;
        case MambaCacheMode::kAll:
          return ceil_div(o.context, s.block_size);
      }
  }
  HEADWISE_CHECK(false, "unknown vLLM spec kind");
}

std::vector<VllmSpec> vllm_specs(const arch::ModelSpec& spec, const HeadWindows& windows,
                                 const MemoryOptions& o, const VllmOptions& v) {
  validate_options(o);
  validate_vllm_options(v);
  validate_windows(spec, windows);
  if (o.sink_tokens != 0) {
    throw_field_error("sink_tokens",
                      ": vLLM's sliding-window specs keep no sink tokens; use 0 with {} vllm/both",
                      field_ref("engine"));
  }
  std::vector<VllmSpec> specs;
  for (const auto& layer : spec.layers) append_layer_specs(layer, windows, spec.dtype, o, specs);
  const int64_t block_size = vllm_block_size(spec, o, v);
  const arch::AttentionShape* att = model_attention(spec);
  const int64_t mamba_page =
      att == nullptr
          ? 0
          : checked_mul(block_size, attention_bytes_per_token(att->num_kv_heads, att->head_dim, o));
  unify_pages(specs, block_size, mamba_page, o);
  const int64_t mamba_block = mamba_block_size(spec, o, v);
  for (auto& s : specs) {
    // A Mamba spec's block size counts tokens per state page ("all" mode), not attention tokens.
    if (s.kind == VllmSpecKind::kMamba) s.block_size = mamba_block;
    s.pages_per_request = vllm_pages_per_request(s, o, v);
  }
  return specs;
}

VllmEstimate vllm_estimate(const arch::ModelSpec& spec, const HeadWindows& windows,
                           const MemoryOptions& o, const VllmOptions& v) {
  VllmEstimate out;
  out.options = o;
  out.vllm = v;
  out.block_size = vllm_block_size(spec, o, v);
  out.specs = vllm_specs(spec, windows, o, v);
  for (const auto& layer : spec.layers) {
    LayerMemory lm;
    lm.layer_id = layer.id;
    lm.kind = layer.kind;
    if (layer.is_global()) lm.kv_head_windows = windows.at(layer.id);
    out.layers.push_back(std::move(lm));
  }
  if (out.specs.empty()) return out;  // attention-free: nothing to reserve
  out.page_bytes = out.specs.front().page_bytes;
  auto [group_size, groups] = group_specs(out.specs);
  out.group_size = group_size;
  out.groups = std::move(groups);
  for (const auto& group : out.groups) {
    int64_t group_pages = 0;
    for (int64_t i : group.specs) {
      const VllmSpec& s = out.specs[static_cast<size_t>(i)];
      group_pages = std::max(group_pages, s.pages_per_request);
      const int64_t bytes = checked_mul(o.batch, checked_mul(s.pages_per_request, s.page_bytes));
      out.page_padding_bytes = checked_add(
          out.page_padding_bytes,
          checked_mul(o.batch,
                      checked_mul(s.pages_per_request, s.page_bytes - s.unpadded_page_bytes)));
      LayerMemory& lm = out.layers[static_cast<size_t>(s.layer_id)];
      if (s.kind == VllmSpecKind::kMamba) {
        lm.state_bytes = checked_add(lm.state_bytes, bytes);
        (s.state_class == arch::StateClass::kLinearState ? out.components.linear_state_bytes
         : s.state_class == arch::StateClass::kSsmState  ? out.components.ssm_state_bytes
                                                         : out.components.other_state_bytes) +=
            bytes;
      } else {
        lm.kv_bytes = checked_add(lm.kv_bytes, bytes);
        (s.global_layer ? out.components.global_kv_bytes : out.components.local_kv_bytes) += bytes;
      }
      lm.bytes = checked_add(lm.bytes, bytes);
    }
    // A padding slot holds as many pages per request as the group's specs.
    out.padding_layer_bytes = checked_add(
        out.padding_layer_bytes,
        checked_mul(o.batch,
                    checked_mul(group.padding_slots, checked_mul(group_pages, out.page_bytes))));
  }
  out.total_bytes = checked_add(out.components.total(), out.padding_layer_bytes);
  return out;
}

namespace {

// One head of a global layer as vLLM sees it in a group of its window, at the attention block.
VllmSpec head_spec(const arch::ModelSpec& spec, const arch::LayerSpec& layer, int64_t window,
                   const MemoryOptions& o, const VllmOptions& v) {
  if (!layer.is_global() || !layer.attention)
    throw_input_error("layer {}: not a global attention layer", layer.id);
  VllmSpec s;
  s.kind = window == kFullWindow ? VllmSpecKind::kFullAttention : VllmSpecKind::kSlidingWindow;
  s.layer_id = layer.id;
  s.global_layer = true;
  s.num_kv_heads = 1;
  s.head_dim = layer.attention->head_dim;
  s.window = window == kFullWindow ? 0 : window;
  s.block_size = vllm_block_size(spec, o, v);
  s.unpadded_page_bytes = natural_page_bytes(s, s.block_size, o);
  s.page_bytes = s.unpadded_page_bytes;
  s.pages_per_request = vllm_pages_per_request(s, o, v);
  return s;
}

int64_t head_spec_bytes(const VllmSpec& s, const MemoryOptions& o) {
  return checked_mul(o.batch, checked_mul(s.pages_per_request, s.page_bytes));
}

}  // namespace

int64_t vllm_head_bytes(const arch::ModelSpec& spec, const arch::LayerSpec& layer, int64_t window,
                        const MemoryOptions& o, const VllmOptions& v) {
  const int64_t full = head_spec_bytes(head_spec(spec, layer, kFullWindow, o, v), o);
  if (window == kFullWindow) return full;
  return std::min(full, head_spec_bytes(head_spec(spec, layer, window, o, v), o));
}

bool vllm_serves_as_full(const arch::ModelSpec& spec, const arch::LayerSpec& layer, int64_t window,
                         const MemoryOptions& o, const VllmOptions& v) {
  if (window == kFullWindow) return true;
  return head_spec_bytes(head_spec(spec, layer, window, o, v), o) >=
         head_spec_bytes(head_spec(spec, layer, kFullWindow, o, v), o);
}

int64_t vllm_fixed_bytes(const arch::ModelSpec& spec, const MemoryOptions& o,
                         const VllmOptions& v) {
  const VllmEstimate e = vllm_estimate(spec, full_kv_windows(spec), o, v);
  return e.components.total() - e.components.global_kv_bytes;
}

Capacity vllm_capacity(const arch::ModelSpec& spec, const HeadWindows& windows,
                       const MemoryOptions& options, const VllmOptions& vllm,
                       int64_t cache_budget_bytes, int64_t context_limit) {
  return capacity_search(
      [&](const MemoryOptions& o) { return vllm_estimate(spec, windows, o, vllm).total_bytes; },
      options, cache_budget_bytes, context_limit);
}

}  // namespace headwise::memory
