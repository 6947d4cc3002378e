#pragma once
// mem-estimate's output: the JSON document tools read and the human table SREs read. Both are
// rendered from a finished MemoryEstimate (nothing is printed before everything is computed).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "headwise/arch/model_spec.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/memory/pipeline_parallel.hpp"
#include "headwise/memory/vllm_model.hpp"

namespace headwise::memory {

// The inputs of a `--gpu-memory` report.
struct GpuFit {
  int64_t gpu_memory_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t weights_bytes = 0;
  int64_t cache_budget_bytes = 0;  // gpu - weights - reserve (may be <= 0: nothing fits)
  Capacity full_kv;
  Capacity policy;
};

// Which allocator's bytes mem-estimate reports (--engine).
enum class Engine { kHeadwise, kVllm, kBoth };
Engine parse_engine(std::string_view text);  // InputError names --engine

// The vLLM side of a report: what its allocator reserves, and its capacity under --gpu-memory.
struct VllmReport {
  // Above 1: `estimate` is one tensor-parallel rank's reservation (every rank's is the same).
  int64_t tensor_parallel_size = 1;
  // Above 1: `estimate` holds the whole model's groups (vLLM groups every stage's layers
  // together) at pipeline_parallel_size batches in flight; `stages` is what each stage reserves
  // (per tensor-parallel rank), `full_kv_stages` the same under full KV.
  int64_t pipeline_parallel_size = 1;
  std::vector<VllmStage> stages, full_kv_stages;
  VllmEstimate estimate;
  int64_t full_kv_total_bytes = 0;
  std::optional<Capacity> gpu_full_kv;
  std::optional<Capacity> gpu_policy;
};

struct Report {
  Engine engine = Engine::kHeadwise;
  std::string model;         // a name for humans
  std::string policy_label;  // "full KV", "uniform window 4096", "policy <file>"
  MemoryEstimate estimate;
  int64_t full_kv_total_bytes = 0;
  std::optional<int64_t> weights_bytes;
  // --gpu-memory under tensor parallelism without --weights-bytes: the GPU fit takes the
  // checkpoint's weights / tp as one rank's (replicated tensors make a rank's share larger).
  bool weights_split_evenly = false;
  std::optional<GpuFit> gpu;
  std::optional<VllmReport> vllm;  // --engine vllm / both
};

// {"context", "batch", "block_size", "kv_dtype", "sink_tokens", "state_dtype", "total_bytes",
//  "components": {...}, "full_kv_total_bytes", "saving_bytes", "weights_bytes" (or null),
//  "layers": [{"layer_id", "kind", "bytes", "kv_bytes", "state_bytes", "kv_head_windows" (or
//  null)}], "gpu_fit": {...} (only with --gpu-memory)}
// --engine vllm: the same keys for vLLM's reservation plus "engine", "vllm_rules_version",
//  "max_model_len", "max_num_batched_tokens", "mamba_cache_mode", "attention_block_size",
//  "page_bytes", "group_size", "kv_cache_groups", "padding_layer_bytes", "page_padding_bytes".
// --engine both: {"engine": "both", "vllm_rules_version", "headwise": {...}, "vllm": {...},
//  "difference": [{"component", "headwise_bytes", "vllm_bytes", "difference_bytes", "why"}]}
nlohmann::json report_json(const Report& report);
std::string report_table(const Report& report, bool per_layer);

}  // namespace headwise::memory
