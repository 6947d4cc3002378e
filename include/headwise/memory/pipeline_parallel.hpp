#pragma once
// What each pipeline-parallel stage of a vLLM deployment reserves.
//
// vLLM splits the decoder layers over the stages as distributed/utils.py get_pp_indices does:
// L // P layers each, the remainder one more to each stage but the last, counted back from the
// second-last (VLLM_PP_LAYER_PARTITION overrides it; not modelled). Its KV cache groups are the
// whole model's (get_kv_cache_configs merges every worker's specs before grouping, so the page
// unification and the group size are the whole model's), projected onto each stage's layers
// (_project_kv_cache_groups_to_worker). One block table serves every stage, so a request takes
// its blocks in every group on every stage; a stage's block holds one page for each of its
// specs in the group where it has the most (_get_kv_cache_bytes_per_block). Per request, a stage
// reserves
//   slots x page x (blocks per request summed over every group, its empty ones included)
// and under pipeline parallelism P batches are in flight (VllmOptions::in_flight_batches), so a
// sliding spec keeps W - 1 + P x max_num_batched_tokens tokens.
#include <cstdint>
#include <utility>
#include <vector>

#include "headwise/memory/vllm_model.hpp"

namespace headwise::memory {

// Decoder layers [first, end) of each stage (get_pp_indices). Throws an input error naming
// --pipeline-parallel-size when there are fewer layers than stages.
std::vector<std::pair<int64_t, int64_t>> pipeline_layer_ranges(int64_t num_layers,
                                                               int64_t pipeline_parallel_size);

struct VllmStage {
  int64_t first_layer = 0;  // decoder layers [first_layer, end_layer)
  int64_t end_layer = 0;
  int64_t specs = 0;        // vLLM KV cache specs (attention window classes, states) it holds
  int64_t slots = 0;        // pages per block: its most specs in one group
  int64_t blocks = 0;       // blocks per request, summed over every group
  int64_t own_bytes = 0;    // the pages its specs use, times options.batch
  int64_t total_bytes = 0;  // slots x page x blocks, times options.batch
};

// Each stage of `estimate` (one tensor-parallel rank's, or the whole model's at TP 1), computed
// with estimate.vllm.in_flight_batches as the deployment runs it.
std::vector<VllmStage> vllm_stages(const VllmEstimate& estimate, int64_t pipeline_parallel_size);

}  // namespace headwise::memory
