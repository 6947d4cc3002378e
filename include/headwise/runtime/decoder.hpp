#pragma once
// The reference decoder: a policy applied *physically*. Every global KV head keeps only the
// slots the grouped cache gives it (grouped_cache.hpp's ring rule), so a key outside a head's
// window is overwritten, not masked; sliding layers keep their ring; linear/SSM layers keep
// their states in the cache's LayerState maps. Chunked prefill, then token-by-token decode.
#include <ATen/ATen.h>

#include <cstdint>

#include "headwise/arch/model.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/runtime/eviction_cache.hpp"
#include "headwise/runtime/grouped_cache.hpp"

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace headwise::runtime {

// How a policy's global layers run: nullopt when every head keeps its window (the grouped cache);
// else H2O in the layers with an h2o head (kv_head_rules), whose other heads keep their windows.
std::optional<EvictionOptions> policy_selection(const policy::Policy& policy);

// Attends the new tokens' queries over exactly what the cache holds plus the new keys, then
// writes the new keys into the cache. The cache holds positions [0, position_offset) of the
// sequence (as far as each head's ring keeps them); AttentionInputs::position_offset is
// therefore also the cache's fill level, which keeps the core stateless.
//
// Attending to [held ∪ new] *before* writing makes chunks of any size exact, including chunks
// longer than a head's ring: a key the chunk is about to overwrite is still readable by the
// chunk's own queries that may see it.
class CachedAttentionCore final : public arch::AttentionCore {
 public:
  // `spec` gives sliding layers' cache length; queries are processed `query_chunk` at a time
  // so the workspace is O(query_chunk x held keys).
  CachedAttentionCore(const arch::ModelSpec& spec, GroupedCache& cache, int64_t query_chunk)
      : spec_(spec), cache_(cache), query_chunk_(query_chunk) {}
  at::Tensor attend(const arch::AttentionInputs& inputs) override;
  void set_kernel(arch::AttentionKernel kernel) { kernel_ = kernel; }

 private:
  const arch::ModelSpec& spec_;
  GroupedCache& cache_;
  int64_t query_chunk_;
  arch::AttentionKernel kernel_ = arch::AttentionKernel::kFused;
};

// How a prompt goes through the model (docs/keep-rules.md, "The prefill peak"):
//  - kWholePrompt: chunk by chunk through every layer; the snap heads of every layer stage the
//    whole prompt and choose once it is in (peak: every snap head's staging at once);
//  - kLayerByLayer: every chunk through a layer before the next layer (the prompt's hidden
//    states are held), each layer's snap heads choosing right after it, as kvpress compresses
//    (peak: one layer's snap staging). The logits are the same.
enum class PrefillSchedule { kWholePrompt, kLayerByLayer };
// "whole" or "layer"; InputError naming `flag` otherwise.
PrefillSchedule prefill_schedule_from_name(std::string_view name, std::string_view flag);

class Decoder {
 public:
  // Allocates the grouped cache for `windows` at `options` on the model's device. The model
  // must outlive the decoder.
  Decoder(arch::DecoderModel& model, const memory::HeadWindows& windows,
          const memory::MemoryOptions& options);
  // The same slots per head, but global layers choose their tokens online (SnapKV / H2O / AdaKV,
  // eviction_cache.hpp) instead of keeping a window; other layers are as above.
  Decoder(arch::DecoderModel& model, const memory::HeadWindows& windows,
          const memory::MemoryOptions& options, const EvictionOptions& eviction);
  // The attention core refers to the cache member: neither may move.
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Forgets the sequence: zeroes every buffer and state in place (no reallocation).
  void reset();

  // Runs `ids` [batch, T] (batch = the cache's) through the model in chunks of `chunk` tokens,
  // continuing the current sequence. Returns logits [batch, T, vocab] float32.
  at::Tensor prefill(const at::Tensor& ids, int64_t chunk);
  // One token per sequence ([batch] int64) → logits [batch, vocab].
  at::Tensor decode_step(const at::Tensor& tokens);
  // Greedy continuation of `n` tokens from the last logits: [batch, n]. The last token is
  // returned but not fed back (nothing reads its logits), so it takes no cache position.
  at::Tensor generate(int64_t n);

  int64_t position() const { return position_; }
  // Under eviction the grouped cache holds only the non-global layers' buffers and states.
  const GroupedCache& cache() const { return cache_; }
  // Null unless constructed with EvictionOptions.
  const EvictionCache* eviction_cache() const { return eviction_.get(); }
  // Storage of every KV buffer and state the decoder holds (grouped cache + eviction pools):
  // memory::estimate's total. Eviction's auxiliary buffers and prompt staging are not in it.
  int64_t cache_bytes() const;
  // The eviction cache's position and score buffers and region table (0 without one): a policy
  // whose heads select tokens counts them in its bytes (memory::estimate with its selecting heads).
  int64_t bookkeeping_bytes() const { return eviction_ ? eviction_->auxiliary_bytes() : 0; }
  // The most KV bytes held at once so far: cache_bytes() + bookkeeping_bytes() + the eviction
  // cache's peak staging (snap heads' prompt K/V and scores; SnapKV/AdaKV's staging).
  // memory::prefill_peak states it for a fresh request.
  int64_t peak_kv_bytes() const;
  void set_prefill_schedule(PrefillSchedule schedule) { schedule_ = schedule; }
  PrefillSchedule prefill_schedule() const { return schedule_; }
  arch::DecoderModel& model() { return model_; }
  // Fused attention by default; kExplicit reproduces the plain forward's numerics bit for bit
  // where the fused kernel would apply (to compare the two, e.g. tools/bench-runtime-attention.sh).
  void set_attention_kernel(arch::AttentionKernel kernel);

 private:
  at::Tensor run_chunk(const at::Tensor& ids);  // [batch, t] → logits [batch, t, vocab]
  // The prompt layer by layer (kLayerByLayer): logits per chunk.
  std::vector<at::Tensor> prefill_by_layer(const at::Tensor& ids, int64_t chunk);

  arch::DecoderModel& model_;
  GroupedCache cache_;
  CachedAttentionCore core_;
  std::unique_ptr<EvictionCache> eviction_;  // global layers under eviction, or null
  std::unique_ptr<EvictionAttentionCore> eviction_core_;
  int64_t position_ = 0;
  PrefillSchedule schedule_ = PrefillSchedule::kWholePrompt;
  at::Tensor last_logits_;  // [batch, vocab] of the last fed token
};

}  // namespace headwise::runtime
