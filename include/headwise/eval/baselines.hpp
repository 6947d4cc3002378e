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

// PyramidKV-style: windows decrease linearly with depth (global layer j of G gets a share
// (2(G - j) - 1) / G of the mean), the scale chosen as large as fits.
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

}  // namespace headwise::eval
