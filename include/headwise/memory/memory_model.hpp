#pragma once
// The exact cache memory model (docs/memory.md). Per request at context C,
// batch B, KV element size s, block size b (1 = unpaged), sinks S:
//   global layer, KV head with window w:  ceil(min(w + S, C) / b) * b * head_dim * 2 * s
//                 (full window:           ceil(C / b) * b * head_dim * 2 * s)
//   sliding layer: ceil(min(cache_tokens, C) / b) * b * num_kv_heads * head_dim * 2 * s
//   recurrent / conv states: their exact shapes and dtypes (LayerSpec::states)
//   global layer whose heads select tokens (a policy's h2o heads): per slot of the layer, its
//                 position (int64) and keep score (float32), plus 3 int64 per KV head
//   total = B * sum of the above.
// runtime::GroupedCache allocates exactly these bytes; tests hold the two equal to the byte.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/core/dtype.hpp"
#include "headwise/core/window.hpp"

namespace headwise::memory {

// A window value meaning "no truncation" (the `full` level); one constant project-wide.
using headwise::kFullWindow;

struct MemoryOptions {
  int64_t context = 0;                // C, tokens
  int64_t batch = 1;                  // B, sequences
  DType kv_dtype = DType::kBFloat16;  // K/V element type of attention layers
  int64_t block_size = 16;            // paged rounding per head (1 = unpaged)
  int64_t sink_tokens = 0;            // S, kept by every windowed head
  std::optional<DType> state_dtype;   // overrides every recurrent/conv state's dtype
};
// Throws a FieldError naming the field (context, batch, ...) when a value is out of range.
void validate_options(const MemoryOptions& options);

// Per global layer, the window of each KV head (kFullWindow = full), keyed by layer id.
using HeadWindows = std::map<int64_t, std::vector<int64_t>>;
HeadWindows full_kv_windows(const arch::ModelSpec& spec);
HeadWindows uniform_windows(const arch::ModelSpec& spec, int64_t window);
// Every global layer present with one positive window (or kFullWindow) per KV head, and no
// other layer; errors name the layer.
void validate_windows(const arch::ModelSpec& spec, const HeadWindows& windows);

// Token slots one KV head of a global layer holds: round_up(min(w + S, C), b).
int64_t global_head_slots(int64_t window, const MemoryOptions& options);
// Token slots a sliding layer holds: round_up(min(cache_tokens, C), b).
int64_t sliding_layer_slots(const arch::AttentionShape& attention, const MemoryOptions& options);
// Bytes of one state tensor for one sequence at the options' state dtype.
int64_t state_bytes_per_sequence(const arch::StateTensorSpec& state, const MemoryOptions& options);
// r[i][h](w) of design.md: bytes (times batch) one KV head of `layer` needs with window `window`.
int64_t head_bytes(const arch::AttentionShape& attention, int64_t window,
                   const MemoryOptions& options);

struct Components {
  int64_t global_kv_bytes = 0;
  int64_t local_kv_bytes = 0;
  int64_t linear_state_bytes = 0;
  int64_t ssm_state_bytes = 0;
  int64_t other_state_bytes = 0;
  int64_t selection_state_bytes =
      0;  // token-selection bookkeeping of layers whose heads select tokens
  int64_t total() const;
};

struct LayerMemory {
  int64_t layer_id = 0;
  arch::LayerKind kind = arch::LayerKind::kMlpOnly;
  int64_t bytes = 0;            // everything the layer holds, times batch
  int64_t kv_bytes = 0;         // K + V part
  int64_t state_bytes = 0;      // recurrent/conv part
  int64_t selection_bytes = 0;  // token-selection bookkeeping (selecting global layers only)
  std::optional<std::vector<int64_t>> kv_head_windows;  // global layers only
};

struct MemoryEstimate {
  MemoryOptions options;
  Components components;
  int64_t total_bytes = 0;          // == components.total()
  std::vector<LayerMemory> layers;  // every layer, in order
};

MemoryEstimate estimate(const arch::ModelSpec& spec, const HeadWindows& windows,
                        const MemoryOptions& options);
// The same with the global layers in `selecting` choosing tokens online (runtime::EvictionCache):
// their slots are the windows' slots, plus the bookkeeping selection_bytes() counts.
MemoryEstimate estimate(const arch::ModelSpec& spec, const HeadWindows& windows,
                        const MemoryOptions& options, const std::set<int64_t>& selecting);
// Bytes (times batch) of one selecting global layer's bookkeeping: per slot a position (int64)
// and a keep score (float32), per KV head its region's offset, length and fill (int64 each).
int64_t selection_bytes(const arch::AttentionShape& attention, const std::vector<int64_t>& windows,
                        const MemoryOptions& options);
// Total bytes with every global head at full KV (the comparison baseline; also for `inspect`).
int64_t full_kv_bytes(const arch::ModelSpec& spec, const MemoryOptions& options);
// F of design.md: bytes (times batch) of everything outside global layers' KV — sliding KV and all
// states, including the states of global layers that also keep one (Falcon-H1).
int64_t fixed_bytes(const arch::ModelSpec& spec, const MemoryOptions& options);

// Capacity under a cache budget. Memory grows monotonically with context and linearly with
// batch, so the largest context is a binary search and the largest batch a division.
// nullopt context: fits at every context up to `context_limit` (all windows finite).
struct Capacity {
  std::optional<int64_t> max_context;  // at options.batch; 0 = not even one token fits
  int64_t max_batch = 0;               // at options.context
};
inline constexpr int64_t kContextSearchLimit = int64_t{1} << 30;
// `selecting`: global layers whose heads select tokens (their bookkeeping grows with the slots).
Capacity capacity(const arch::ModelSpec& spec, const HeadWindows& windows,
                  const MemoryOptions& options, int64_t cache_budget_bytes,
                  int64_t context_limit = kContextSearchLimit,
                  const std::set<int64_t>& selecting = {});
// The same search for any engine's total: `total_bytes` must grow with context and be linear in
// batch.
using TotalBytes = std::function<int64_t(const MemoryOptions&)>;
Capacity capacity_search(const TotalBytes& total_bytes, const MemoryOptions& options,
                         int64_t cache_budget_bytes, int64_t context_limit = kContextSearchLimit);

}  // namespace headwise::memory
