#pragma once
// Baseline window assignments built to the same global-KV bytes as a policy (memory model
// bytes at the policy's memory options), so quality is compared at equal memory. Each
// baseline spends at most `budget` and — by a final top-up that lengthens single heads' windows
// — leaves less than one block per head unspent.
#include <cstdint>
#include <map>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::eval {

// Global-KV bytes of `windows` (every global head's head_bytes, summed; batch included).
int64_t global_kv_bytes(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                        const memory::MemoryOptions& options);
// One block of every global KV head, summed: the tolerance "within one block per head".
int64_t one_block_per_head(const arch::ModelSpec& spec, const memory::MemoryOptions& options);

// One window for every head: the largest (any integer, not only ladder levels) that fits.
memory::HeadWindows uniform_baseline(const arch::ModelSpec& spec,
                                     const memory::MemoryOptions& options, int64_t budget);

// Pyramidal recency windows (the `pyramid-windows` ablation: PyramidKV's shape of allocation
// without its token selection): windows decrease linearly with depth (global layer j of G gets a
// share (2(G - j) - 1) / G of the mean), the scale chosen as large as fits.
memory::HeadWindows pyramid_baseline(const arch::ModelSpec& spec,
                                     const memory::MemoryOptions& options, int64_t budget);

// Random ladder levels per head (seeded): heads in a random order each draw a level uniformly
// among those that still fit with every later head at the smallest level.
memory::HeadWindows random_baseline(const arch::ModelSpec& spec,
                                    const memory::MemoryOptions& options, int64_t budget,
                                    const std::vector<int64_t>& ladder, uint64_t seed);

// Retrieval heads and streaming heads (the retrieval-score and duo baselines): heads ranked by
// `scores` (highest first) get full KV while that fits with the rest at `short_window`; the rest
// share the longest short window the remaining bytes allow. `name` names the baseline in errors.
using HeadScores = std::map<int64_t, std::vector<double>>;  // global layer → score per KV head
memory::HeadWindows ranked_full_baseline(const arch::ModelSpec& spec,
                                         const memory::MemoryOptions& options, int64_t budget,
                                         const HeadScores& scores, int64_t short_window,
                                         const char* name);

// ---- Online eviction at its own allocation (the methods as published) ----
//
// A head that selects its tokens online (runtime::EvictionCache) needs, per slot, the position it
// holds and its keep score, and per head its region: memory::selection_bytes. Those bytes are
// part of what such a method holds, so they are paid from the same budget as the K/V: every
// builder below spends at most `budget` on K/V plus bookkeeping, every global layer selecting.

// K/V plus selection bookkeeping of `windows` when every global layer selects its tokens.
int64_t selecting_bytes(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                        const memory::MemoryOptions& options);

// One capacity for every global KV head, the largest whose K/V and bookkeeping fit: H2O, SnapKV
// and AdaKV as published (a uniform budget per head; AdaKV re-divides each layer's total among
// its heads at the prompt's end).
memory::HeadWindows uniform_selecting_baseline(const arch::ModelSpec& spec,
                                               const memory::MemoryOptions& options,
                                               int64_t budget);

// PyramidKV's allocation (Cai et al., 2024, as in its KVCache-Factory code): over the G global
// layers (the layers that keep a KV cache to compress), layer j keeps `observation_window` +
// round(max - j (max - min) / (G - 1)) tokens per head, min = P / beta and max = 2P - min, P the
// mean prefix budget per head (when max exceeds context - window, max is capped there and min =
// 2P - max); P is the largest whose K/V and bookkeeping fit. Where that pyramid cannot be built
// (min below the observation window, as PyramidKV's code checks), the allocation falls back to
// uniform, as PyramidKV does; `pyramidal` says which happened.
struct PyramidKVAllocation {
  memory::HeadWindows windows;
  bool pyramidal = true;
  int64_t mean_prefix = 0;  // P
};
PyramidKVAllocation pyramidkv_baseline(const arch::ModelSpec& spec,
                                       const memory::MemoryOptions& options, int64_t budget,
                                       int64_t observation_window, double beta);

}  // namespace headwise::eval
