#pragma once
// policy.yaml, schema `headwise/policy/v1`: the per-KV-head window policy plus everything that
// makes it auditable (serving shape, model fingerprint, ladder, provenance, exact memory).
//
//   schema: headwise/policy/v1
//   model_name: Qwen3-Next-80B-A3B-Instruct
//   model_path: /models/qwen3-next          # where config.json lives (mem-estimate --config)
//   model_fingerprint: {config_sha256: <hex>, weights_headers_sha256: <hex> | null}
//   budget_gb: 48                            # cache budget in GiB (2^30 bytes)
//   context: 131072
//   batch: 1
//   dtype: bfloat16                          # KV dtype
//   state_dtype: float32                     # optional: every recurrent/conv state's dtype
//   block_size: 16
//   sink_tokens: 0
//   window_levels: [1024, 4096, 16384, full] # the ladder; `full` = untruncated
//   calibration: {dataset_sha256: ..., samples: 64, ...}   # free-form provenance map
//   memory: {total_bytes, global_kv_bytes, local_kv_bytes, linear_state_bytes,
//            ssm_state_bytes, other_state_bytes, full_kv_total_bytes}
//   non_global_layers: [{layer_id: 0, kind: linear_attention, bytes: N}, ...]
//   per_layer_policies:
//     - {layer_id: 3, kv_head_windows: [4096, full], expected_distortion: [0.012, 0.0]}
//     - {layer_id: 7, kv_head_windows: [4096, 1024], kv_head_rules: [h2o, window]}  # optional
//
// The writer is deterministic (same Policy → same bytes) and atomic; the reader is strict
// (unknown keys, windows outside the ladder, wrong head counts, non-global layer ids → InputError
// naming the file, key and layer).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/core/dtype.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/keep_rule.hpp"

namespace headwise::policy {

inline constexpr std::string_view kSchema = "headwise/policy/v1";
// A window of kFull means untruncated; files spell it `full`.
inline constexpr int64_t kFull = memory::kFullWindow;

struct LayerPolicy {
  int64_t layer_id = 0;
  std::vector<int64_t> kv_head_windows;     // one per KV head, each a ladder level (kFull = full)
  std::vector<double> expected_distortion;  // empty, or one per KV head
  std::vector<KeepRule> kv_head_rules;  // empty (every head keeps its window), or one per KV head

  bool selects_tokens() const;       // some head's rule selects tokens (every rule but window)
  KeepRule rule(size_t head) const;  // the head's rule (kWindow when none is listed)
};

struct NonGlobalLayer {
  int64_t layer_id = 0;
  std::string kind;  // arch::layer_kind_name
  int64_t bytes = 0;
};

struct PolicyMemory {
  memory::Components components;
  int64_t total_bytes = 0;
  int64_t full_kv_total_bytes = 0;
};

// The engine whose bytes the budget counted, when it is not headwise's own cache (calibrate
// --engine vllm), with the parameters that set its bytes; the file's
//   engine: {name: vllm, rules_version: 0.25.1, max_num_batched_tokens: 2048,
//            mamba_cache_mode: none, attention_block_size: 640, total_bytes: N,
//            full_kv_total_bytes: N}
// (block size, context, batch, dtypes: the policy's own fields). Absent in every other policy.
struct EngineRecord {
  std::string name = "vllm";
  std::string rules_version;  // VLLM_RULES_VERSION the bytes follow
  int64_t max_num_batched_tokens = 0;
  std::string mamba_cache_mode = "none";
  int64_t attention_block_size = 0;  // vLLM's block after its hybrid alignment (block_size or more)
  int64_t total_bytes = 0;           // vLLM's reservation for `batch` requests at `context`
  int64_t full_kv_total_bytes = 0;   // the same without a policy
};

struct ModelFingerprint {
  std::string config_sha256;  // sha256 of config.json's bytes
  std::optional<std::string>
      weights_headers_sha256;  // Checkpoint::headers_sha256, null without weights
};

struct Policy {
  std::string model_name;
  std::string model_path;
  ModelFingerprint fingerprint;
  double budget_gb = 0;  // GiB
  int64_t context = 0;
  int64_t batch = 1;
  DType dtype = DType::kBFloat16;
  // The dtype the serving cache keeps every recurrent/convolution state in (linear-attention,
  // SSM, short-conv layers), between prefill chunks and decode steps. nullopt (`state_dtype`
  // absent, as in every policy written before the field existed; `--state-dtype native`): each
  // state in the dtype the architecture's reference cache allocates (arch::StateTensorSpec::dtype:
  // convolution states in the checkpoint's dtype, Qwen3-Next's recurrent and Mamba's SSM states in
  // float32).
  std::optional<DType> state_dtype;
  int64_t block_size = 16;
  int64_t sink_tokens = 0;
  std::vector<int64_t> window_levels;                     // ascending, kFull last if present
  nlohmann::json calibration = nlohmann::json::object();  // provenance, free-form
  PolicyMemory memory;
  std::optional<EngineRecord> engine;  // nullopt: headwise's runtime
  // The tensor-parallel size the windows were chosen to shard over (calibrate
  // --tensor-parallel-size; `tensor_parallel_size` in the file): every rank's shard of each global
  // layer's KV heads holds the same windows (memory/tensor_parallel.hpp). nullopt: calibrated
  // without the constraint (the file omits the key, so older policies stay byte-identical).
  std::optional<int64_t> tensor_parallel_size;
  std::vector<NonGlobalLayer> non_global_layers;
  std::vector<LayerPolicy> per_layer_policies;  // ascending layer_id

  memory::MemoryOptions memory_options()
      const;  // context, batch, dtype, state dtype, block size, sinks
  memory::HeadWindows head_windows() const;
  // Global layers with a head whose rule selects tokens (the runtime's eviction cache holds them;
  // their bookkeeping is in the memory block), and the (layer id, KV head) pairs of those layers
  // that keep windows.
  std::set<int64_t> selecting_layers() const;
  std::set<std::pair<int64_t, int64_t>> window_heads_of_selecting_layers() const;
  // The (layer id, KV head) pairs whose rule is `rule`.
  std::set<std::pair<int64_t, int64_t>> heads_with_rule(const KeepRule& rule) const;
  bool selects_tokens() const { return !selecting_layers().empty(); }
};

// sha256 of config.json and of the safetensors headers (null when the directory has none).
ModelFingerprint fingerprint_model(const std::filesystem::path& model_dir);

// Fills memory, non_global_layers and every layer's bytes from the memory model; the caller
// sets windows, serving shape and provenance first. Validates the windows against the spec.
void fill_memory(Policy& policy, const arch::ModelSpec& spec);

// Checks a policy against a model: every global layer exactly once, head counts, windows in
// the ladder, the memory block equal to what the memory model computes. `where` names the file.
void validate_against_model(const Policy& policy, const arch::ModelSpec& spec,
                            std::string_view where);

std::string to_yaml(const Policy& policy);
// `where` names the source in errors (a path, or "<string>").
Policy from_yaml(std::string_view text, std::string_view where);

void write_policy(const std::filesystem::path& path, const Policy& policy);  // atomic
Policy read_policy(const std::filesystem::path& path);

// The dtypes a policy may keep its states in (float32, bfloat16, float16); anything else is an
// InputError naming `what`. "native" is not a dtype: callers map it to nullopt first.
DType parse_state_dtype(std::string_view text, std::string_view what);

// "full" or the integer.
std::string window_name(int64_t window);

}  // namespace headwise::policy
