#pragma once
// The prefill peak of a policy whose heads keep by the snap rule (docs/keep-rules.md). A snap head
// chooses its keys at the prompt's end, so until then it holds the prompt: per staged token its
// key and value (2 * head_dim * s bytes, s the KV element size) and its float32 score (4 bytes),
// beside the policy's own cache (memory::estimate with its selecting layers), which is allocated
// before the prompt and held throughout. For a fresh request of P prompt tokens, batch B:
//   staging per token  = B * sum over snap heads of (2 * head_dim * s + 4)
//   whole-prompt peak  = steady + P * staging per token (every layer stages, then all choose)
//   layer-by-layer peak = steady + P * max over layers of that layer's staging per token
//                        (each layer chooses right after it ran the prompt, as kvpress does)
// In disaggregated prefill the peak sits on the prefill node; the decode node holds the steady
// bytes, and what crosses the network per request is that request's cache as allocated (batch 1:
// its KV pools, selection bookkeeping and recurrent/sliding states; blocks move whole).
// runtime::Decoder::peak_kv_bytes measures the same (tests hold them equal to the byte).
#include <cstdint>
#include <set>
#include <utility>

#include "headwise/memory/memory_model.hpp"

namespace headwise::memory {

// (layer id, KV head) of the heads that keep by the snap rule.
using SnapHeads = std::set<std::pair<int64_t, int64_t>>;

struct PrefillPeak {
  int64_t prompt_tokens = 0;
  int64_t steady_bytes = 0;                // estimate(...).total_bytes: decode's bytes, the budget
  int64_t staging_bytes_per_token = 0;     // every snap head, times batch
  int64_t whole_staging_bytes = 0;         // P * staging_bytes_per_token
  int64_t layer_staging_bytes = 0;         // P * the largest layer's staging per token
  int64_t whole_prompt_peak_bytes = 0;     // steady + whole staging
  int64_t layer_by_layer_peak_bytes = 0;   // steady + layer staging
  int64_t decode_node_bytes = 0;           // = steady_bytes
  int64_t transfer_bytes_per_request = 0;  // the request's cache at batch 1
};

// What one snap head of a layer shaped `attention` stages per prompt token of one sequence: its key
// and value (2 * head_dim * s) and its float32 score (4). The peak's staging is this times the
// prompt's tokens and the batch, summed over the snap heads (of one layer, layer by layer).
int64_t snap_staging_bytes_per_token(const arch::AttentionShape& attention,
                                     const MemoryOptions& options);

// Throws InputError for a prompt outside 1..context or a snap head that is not a KV head of a
// selecting global layer.
PrefillPeak prefill_peak(const arch::ModelSpec& spec, const HeadWindows& windows,
                         const MemoryOptions& options, const std::set<int64_t>& selecting,
                         const SnapHeads& snap_heads, int64_t prompt_tokens);

}  // namespace headwise::memory
