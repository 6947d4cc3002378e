#pragma once
// A model as one tensor-parallel rank holds it, and whether a policy's windows shard.
//
// vLLM shards a layer's KV heads over the tensor-parallel ranks as QKVParallelLinear does: rank
// r holds the contiguous heads [r*k, (r+1)*k), k = heads / ranks, or, where a layer has fewer KV
// heads than ranks, one replicated head (rank r holds head r / (ranks / heads)). The query heads
// and a gated-DeltaNet layer's heads (so its conv and recurrent states) split the same way. Every
// rank builds the same attention layers and KV cache specs, so a headwise policy serves at a
// tensor-parallel size only when every rank's shard of every global layer holds the same
// multiset of windows; each rank then reserves what the rank's shard needs, and that is what
// vLLM reports per rank (its scheduler's KV cache configuration is one rank's).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::memory {

// The checkpoint KV heads each rank holds (vLLM's QKVParallelLinear). Throws an input error
// naming --tensor-parallel-size when the heads do not split (vLLM asserts the same).
std::vector<std::vector<int64_t>> tensor_parallel_shards(int64_t num_kv_heads,
                                                         int64_t tensor_parallel_size);

// nullopt when every rank's shard of `windows` (one layer, checkpoint head order) holds the same
// multiset; otherwise which ranks differ and how ("rank 0 holds [64, 256], rank 1 [256, 256]").
std::optional<std::string> shard_mismatch(const std::vector<int64_t>& windows,
                                          int64_t tensor_parallel_size);

// The first layer whose shards differ, with the mismatch; nullopt when every layer shards.
std::optional<std::pair<int64_t, std::string>> first_unshardable_layer(
    const HeadWindows& windows, int64_t tensor_parallel_size);

// One rank's model: attention layers with num_heads / tp query heads and max(1, kv / tp) KV
// heads; every recurrent state as vLLM's MambaStateShapeCalculator shards it: gated DeltaNet,
// Mamba-1 and short convolutions split their first dimension, Mamba-2 splits its heads and its
// groups (a single group is replicated on every rank). Shapes vLLM refuses throw an input error
// naming --tensor-parallel-size and the layer.
arch::ModelSpec shard_model_spec(const arch::ModelSpec& spec, int64_t tensor_parallel_size);

// Rank `rank`'s windows: each global layer's shard, in checkpoint head order.
HeadWindows shard_windows(const HeadWindows& windows, int64_t tensor_parallel_size, int64_t rank);

}  // namespace headwise::memory
