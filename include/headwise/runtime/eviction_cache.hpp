#pragma once
// Online KV eviction (SnapKV, H2O, AdaKV) at a policy's bytes: the classic methods that keep a
// fixed number of entries per KV head and choose *which* tokens by attention, instead of a
// window of the most recent ones.
//
// Storage. Every global layer holds one K and one V pool [batch, sum_h capacity_h, head_dim] in
// the KV dtype, where capacity_h = memory::global_head_slots(window_h) is exactly what the
// grouped cache gives head h under the policy (round_up(min(w + S, C), b); the S sink slots and
// the block padding are ordinary slots here). So the KV bytes equal memory::estimate's global KV
// to the byte. Each (sequence, KV head) owns a contiguous region of its layer's pool; SnapKV and
// H2O keep the regions at the capacities, AdaKV moves the boundaries within a layer (same total).
// Kept entries stay with their original post-RoPE keys, so positions are preserved.
//
// Auxiliary buffers, not KV bytes, reported apart (auxiliary_bytes): the position held in each
// slot (int64), a keep priority per slot (float32: H2O's accumulated attention, SnapKV/AdaKV's
// pooled score) and the region table. SnapKV/AdaKV also *stage* the whole prompt's keys and
// values during prefill and compress at its end — that is how they work (prefill peak = full KV
// of the prompt); peak_staged_bytes() reports it. H2O and the chunked SnapKV/AdaKV never stage:
// their cache is bounded throughout.
//
// Rules (ties always keep the more recent position, so every choice is deterministic):
//  - SnapKV (Li et al., 2024): at the end of the prompt, the last `obs` prompt queries (the
//    observation window) attend over every prompt key; each prefix key's probability is summed
//    over those queries and over the KV head's query heads, pooled along positions (1-D max or
//    avg pooling, kernel 7, stride 1, as in its code), and the head keeps the observation window
//    plus the top (capacity - obs) prefix keys.
//  - AdaKV (Feng et al., 2024): SnapKV's scores, but the layer's prefix budget (sum of the
//    heads' capacities minus every head's observation window) goes to the highest scores across
//    all KV heads of the layer, flattened, after each head got its safeguard floor
//    (floor(alpha * mean per-head prefix budget), alpha 0.2). AdaKV's code adds the floor to
//    (1 - alpha) x the flattened counts; giving the floor first and the rest by flattened top-k
//    keeps the layer's total exact and each head within its candidates.
//  - SnapKV/AdaKV with chunked prefill (EvictionPrefill::kEachChunk, eval's snapkv-chunked and
//    adakv-chunked): the rule above applied at the end of every prefill chunk, over the held keys
//    plus the chunk's, with the chunk's last `obs` queries as the observation window. This is how
//    these methods run when the prompt's K/V may not exceed the budget (chunked prefill in a
//    serving engine, a prompt longer than the free memory): nothing is staged (a chunk's own
//    keys are activations, as for every method), and the question at the prompt's end picks
//    only among what earlier chunks kept.
//  - Decode under SnapKV/AdaKV: published SnapKV appends generated tokens without bound; at a
//    fixed byte budget each new token displaces the lowest-scored kept prefix key (observation
//    window and generated tokens score +inf, so they go last, oldest first).
//  - H2O (Zhang et al., 2023): every key accumulates the attention probability it receives
//    (summed over the queries so far and the KV head's query heads); when a head overflows, it
//    keeps the capacity/2 most recent tokens plus the highest accumulated scores among the rest.
//    Evicts during chunked prefill and decode: a chunk's queries see the held keys plus the
//    chunk's own (activations, as in the grouped cache); token-by-token it is exactly H2O.
//  - A window head (EvictionOptions::window_heads) keeps its sink positions and otherwise the
//    most recent tokens; its capacity (>= window + sinks) holds every key its window shows.
//  - A snap head (EvictionOptions::snap_heads, the policy keep rule `snap`, docs/keep-rules.md):
//    SnapKV's selection for one head beside window and h2o heads. During a prompt it stages the
//    prompt's K/V (KV dtype) and a float32 score per staged key: the attention probability the
//    observation window's queries (the prompt's last `observation_window` tokens) give it,
//    summed over those queries and the KV head's query heads as each chunk arrives (causal: a
//    query sees only keys already staged, so nothing else is kept). At the prompt's end
//    (EvictionAttentionCore::end_prompt) it keeps, in its slots, the observation window and the
//    prefix keys with the highest max-pooled score (kernel `pooling_kernel`); ties: the higher
//    raw score, then the lower position. Decode: SnapDecode.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::runtime {

enum class EvictionMethod { kSnapKV, kH2O, kAdaKV };
enum class ScorePooling { kMax, kAvg };
// When SnapKV/AdaKV compress: once, at the end of the whole prompt (as published: the prompt's
// K/V are staged until then), or at the end of every prefill chunk (bounded by the budget).
enum class EvictionPrefill { kWholePrompt, kEachChunk };
// How a snap head decodes once its slots are full: the observation window and the tokens after it
// rotate in a ring of as many slots while the selected prefix keys stay (kRecentRing), or each new
// token displaces the lowest-scored kept prefix key (kDisplaceLowest, SnapKV's own decode above).
enum class SnapDecode { kRecentRing, kDisplaceLowest };

struct EvictionOptions {
  EvictionMethod method = EvictionMethod::kSnapKV;
  int64_t observation_window =
      32;  // SnapKV/AdaKV: prompt queries that score the prefix (fewer if the prompt is shorter)
  int64_t pooling_kernel = 7;  // SnapKV/AdaKV: odd 1-D pooling kernel over positions (1 = none)
  ScorePooling pooling = ScorePooling::kMax;
  double adakv_floor = 0.2;  // AdaKV: each head's prefix budget is at least this share of the mean
  EvictionPrefill prefill =
      EvictionPrefill::kWholePrompt;  // SnapKV/AdaKV only (H2O always evicts per chunk)
  // Heads that keep their window instead of choosing by the method: (layer id, KV head). Such a
  // head holds its sinks and its most recent tokens and each query sees exactly what the grouped
  // cache would show it (arch::key_visible with the head's window and sinks). A headwise policy
  // whose heads mix windows and heavy-hitter selection runs as H2O with its window heads here.
  // H2O only: SnapKV/AdaKV decide at the prompt's end over every head of a layer together.
  std::set<std::pair<int64_t, int64_t>> window_heads;
  // Heads that select by the snap rule (layer id, KV head): H2O only (the policy's mixed mode),
  // disjoint from window_heads. See the rules above.
  std::set<std::pair<int64_t, int64_t>> snap_heads;
  SnapDecode snap_decode = SnapDecode::kRecentRing;
  // Global layers under eviction; empty: every global layer. The others keep the grouped cache's
  // windows (and need no position or score buffers).
  std::set<int64_t> layers;
};

// The global layers `options` puts under eviction.
std::set<int64_t> evicted_layers(const arch::ModelSpec& spec, const EvictionOptions& options);

// "snapkv", "h2o", "adakv"; "max", "avg".
std::string eviction_method_name(EvictionMethod method);
// The eval name of a configuration: the method's, with "-chunked" for SnapKV/AdaKV compressing
// at every prefill chunk.
std::string eviction_name(const EvictionOptions& options);
std::string pooling_name(ScorePooling pooling);
// Throws InputError naming the bad parameter.
void validate_eviction_options(const EvictionOptions& options);

// One global layer under eviction. Regions and counts are per sequence and KV head.
struct EvictionLayer {
  int64_t layer_id = 0;
  int64_t num_kv_heads = 0;
  std::vector<int64_t> capacity;  // per KV head: the policy's slots
  std::vector<int64_t> window;  // per KV head: its window when it keeps one (window_heads), else 0
  at::Tensor k, v;              // [batch, sum(capacity), head_dim]: the KV bytes
  at::Tensor position;  // [batch, sum(capacity)] int64: the position in each slot, -1 unused (aux)
  at::Tensor score;     // [batch, sum(capacity)] float32: keep priority (aux)
  std::vector<std::vector<int64_t>> offset, length,
      held;  // [batch][head]: region start, length, entries used
  // SnapKV/AdaKV prefill staging (transient; freed when the layer compresses at the prompt's end).
  at::Tensor staged_k,
      staged_v;  // [batch, kv_heads, n, head_dim] in the KV dtype: prompt positions staged_begin..
  at::Tensor observed_q;  // [batch, kv_heads, group, m, head_dim]: the observation window's queries
  int64_t staged_begin = 0;
  // Snap heads (EvictionOptions::snap_heads): per KV head its index among the layer's snap heads
  // or -1. While a prompt is staged, staged_k/staged_v hold the snap heads' prompt K/V
  // [batch, snap heads, n, head_dim], and snap_received[b][j] the float32 score of each of snap
  // head j's candidates (held, then staged).
  std::vector<int64_t> snap_index;
  int64_t num_snap_heads = 0;
  std::vector<std::vector<at::Tensor>> snap_received;
  int64_t snap_ring = 0;  // kRecentRing: the ring's slots (the last prompt's observation window)
};

class EvictionCache {
 public:
  // Validates (InputError) and allocates zeroed pools on `device` for every global layer.
  static EvictionCache allocate(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                                const memory::MemoryOptions& options,
                                const EvictionOptions& eviction, at::Device device = at::kCPU);

  // The pools of one global layer only (simulate_eviction); internal checks, not user input.
  static EvictionCache allocate_layer(const arch::ModelSpec& spec, int64_t layer_id,
                                      const std::vector<int64_t>& windows,
                                      const memory::MemoryOptions& options,
                                      const EvictionOptions& eviction,
                                      at::Device device = at::kCPU);

  const memory::MemoryOptions& options() const { return options_; }
  const EvictionOptions& eviction() const { return eviction_; }
  EvictionLayer& layer(int64_t layer_id);
  const std::map<int64_t, EvictionLayer>& layers() const { return layers_; }
  std::map<int64_t, EvictionLayer>& layers() { return layers_; }

  // Storage of the K/V pools: equals memory::estimate's global KV bytes for the windows.
  int64_t kv_bytes() const;
  // Position and score buffers plus the region table: bookkeeping, not KV.
  int64_t auxiliary_bytes() const;
  // Bytes staged now (prompt K/V and observation queries) and the most ever staged at once.
  int64_t staged_bytes() const;
  int64_t peak_staged_bytes() const { return peak_staged_bytes_; }
  void note_staged() { peak_staged_bytes_ = std::max(peak_staged_bytes_, staged_bytes()); }

  // A fresh sequence: pools zeroed in place, regions back to the capacities, staging dropped
  // (the peak is kept: it is a property of the whole run).
  void reset();

  // Positions (sequence b, KV head) holds at `layer_id`, ascending; and the most it may hold now.
  std::vector<int64_t> held_positions(int64_t layer_id, int64_t b, int64_t head) const;
  int64_t region_length(int64_t layer_id, int64_t b, int64_t head) const;

 private:
  // InputError when a window head names no KV head of the cache's layers.
  void check_window_heads() const;

  memory::MemoryOptions options_;
  EvictionOptions eviction_;
  std::map<int64_t, EvictionLayer> layers_;
  int64_t peak_staged_bytes_ = 0;
};

// Frees a layer's prompt staging.
void drop_staging(EvictionLayer& layer);

// ---- Selection rules (pure functions on 1-D tensors; the core applies them per head) ----

// Indices of the candidates to keep, ascending by position: the `recent` most recent, then the
// others by score (higher first, ties to the more recent position), `keep` in all. Every
// candidate when there are at most `keep`.
at::Tensor keep_indices(const at::Tensor& position, const at::Tensor& score, int64_t keep,
                        int64_t recent);

// The snap rule's choice: indices of the `keep` candidates with the highest `primary` score,
// ties to the higher `secondary`, then to the lower position; ascending by position. Every
// candidate when there are at most `keep`.
at::Tensor snap_keep_indices(const at::Tensor& position, const at::Tensor& primary,
                             const at::Tensor& secondary, int64_t keep);

// SnapKV's pooling of per-key scores given in position order: stride 1, padding kernel/2
// (max pooling pads with -inf, avg pooling counts the zero padding, as torch's defaults do).
at::Tensor pool_scores(const at::Tensor& score, int64_t kernel, ScorePooling pooling);

// AdaKV's prefix budgets for the heads of one layer: each head first gets min(floor, its
// candidates), then the remaining of `total` goes to the highest scores across all heads
// (ties: more recent position, then lower head). scores[h]/positions[h] are head h's prefix
// candidates. The budgets sum to min(total, all candidates).
std::vector<int64_t> adakv_budgets(const std::vector<at::Tensor>& scores,
                                   const std::vector<at::Tensor>& positions, int64_t total,
                                   int64_t floor);

// Attention over an EvictionCache at global layers (the decoder routes only those here).
class EvictionAttentionCore final : public arch::AttentionCore {
 public:
  EvictionAttentionCore(EvictionCache& cache, int64_t query_chunk)
      : cache_(cache), query_chunk_(query_chunk) {}
  // The prompt about to be prefilled spans positions [begin, end): SnapKV/AdaKV stage it and
  // each layer compresses when its chunk reaches `end`. Decode steps come after it.
  void begin_prompt(int64_t begin, int64_t end);
  // The prompt has been attended by every layer: the snap heads of every layer still staging
  // choose their keys and drop the staging (whole-prompt schedule).
  void end_prompt();
  // Layer `layer_id` has attended the whole prompt: its snap heads choose now (layer schedule).
  void end_prompt_layer(int64_t layer_id);
  // No prompt in progress (a fresh sequence): every step attends and evicts online.
  void forget_prompt();
  at::Tensor attend(const arch::AttentionInputs& inputs) override;
  void set_kernel(arch::AttentionKernel kernel) { kernel_ = kernel; }

 private:
  EvictionCache& cache_;
  int64_t query_chunk_;
  arch::AttentionKernel kernel_ = arch::AttentionKernel::kFused;
  int64_t prompt_begin_ = 0;
  int64_t prompt_end_ = 0;
};

// One global layer's attention output [B, T, num_heads, head_dim] over a whole sequence as the
// runtime decoder computes it under `eviction`: `in`'s keys and queries fed `prefill_chunk`
// tokens at a time (from position in.position_offset = 0) into a fresh one-layer eviction cache
// with `windows`' slots at `options` (its batch and context are taken from `in`). Calibration
// measures a keep rule with it, so it measures what the decoder will do; the explicit kernel
// keeps its numerics independent of the fused kernel's blocking. With `prompt_end` > 0 the
// first prompt_end tokens are the prompt (snap heads choose at its end) and the rest are
// decoded one token at a time.
at::Tensor simulate_eviction(const arch::ModelSpec& spec, const arch::AttentionInputs& in,
                             const std::vector<int64_t>& windows, memory::MemoryOptions options,
                             const EvictionOptions& eviction, int64_t prefill_chunk,
                             int64_t query_chunk, int64_t prompt_end = 0);

}  // namespace headwise::runtime
