#pragma once
// mem-estimate's output: the JSON document tools read and the human table SREs read. Both are
// rendered from a finished MemoryEstimate (nothing is printed before everything is computed).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "headwise/arch/model_spec.hpp"
#include "headwise/memory/memory_model.hpp"

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

struct Report {
  std::string model;  // a name for humans
  std::string policy_label;  // "full KV", "uniform window 4096", "policy <file>"
  MemoryEstimate estimate;
  int64_t full_kv_total_bytes = 0;
  std::optional<int64_t> weights_bytes;
  std::optional<GpuFit> gpu;
};

// {"context", "batch", "block_size", "kv_dtype", "sink_tokens", "state_dtype", "total_bytes",
//  "components": {...}, "full_kv_total_bytes", "saving_bytes", "weights_bytes" (or null),
//  "layers": [{"layer_id", "kind", "bytes", "kv_bytes", "state_bytes", "kv_head_windows" (or null)}],
//  "gpu_fit": {...} (only with --gpu-memory)}
nlohmann::json report_json(const Report& report);
std::string report_table(const Report& report, bool per_layer);

}  // namespace headwise::memory
