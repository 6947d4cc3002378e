#pragma once
// What a model *is*, read from config.json alone: per layer its kind, attention shape and the
// fixed-size decode state it keeps. The memory model, the policy reader and the calibration
// driver all work from this; nothing here needs weights or torch.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/core/dtype.hpp"

namespace headwise::arch {

enum class LayerKind {
  kFullAttention,     // global causal softmax attention: the only KV that grows with context
  kSlidingAttention,  // local attention over the last `sliding_window` tokens
  kLinearAttention,   // gated DeltaNet / linear attention: conv + recurrent state
  kMamba,             // Mamba-1/Mamba-2 SSM: conv + SSM state
  kShortConv,         // LFM2 gated short convolution: conv state only
  kMlpOnly,           // no token mixer (NemotronH '-' and 'E' blocks)
};

std::string_view layer_kind_name(LayerKind kind);  // "full_attention", "sliding_attention", ...
LayerKind parse_layer_kind(std::string_view name, std::string_view what);
// For test and log output.
inline std::ostream& operator<<(std::ostream& os, LayerKind kind) {
  return os << layer_kind_name(kind);
}

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // Tokens a query may see, itself included (HF masking_utils: q - W < k <= q); 0 = unbounded.
  int64_t sliding_window = 0;
  // Tokens a sliding layer's cache holds between decode steps. HF's dynamic sliding cache
  // keeps W - 1, the step's own token makes W; the memory model charges what is allocated.
  int64_t sliding_cache_tokens = 0;

  int64_t query_heads_per_kv_head() const { return num_heads / num_kv_heads; }
};

// Which memory component a fixed-size state belongs to (mem-estimate's breakdown).
enum class StateClass { kLinearState, kSsmState, kOtherState };
std::string_view state_class_name(StateClass c);

// One fixed-size decode-state tensor of a layer, per sequence (the batch dimension is
// implied, first). Shapes and dtypes are those the architecture's reference cache allocates.
struct StateTensorSpec {
  std::string name;            // "conv_state", "recurrent_state", "ssm_state"
  std::vector<int64_t> shape;  // without the batch dimension
  DType dtype = DType::kBFloat16;
  StateClass state_class = StateClass::kOtherState;

  int64_t bytes_per_sequence() const;
};

struct LayerSpec {
  int64_t id = 0;
  LayerKind kind = LayerKind::kMlpOnly;
  std::optional<AttentionShape>
      attention;  // set for full/sliding (and Falcon-H1's parallel attention)
  std::vector<StateTensorSpec> states;

  // Global layers are the only ones whose KV heads get windows.
  bool is_global() const { return attention.has_value() && attention->sliding_window == 0; }
  bool is_sliding() const { return attention.has_value() && attention->sliding_window > 0; }
};

struct ModelSpec {
  std::string model_type;         // the text model's type, e.g. "qwen3_next", "gemma3_text"
  std::string config_model_type;  // as the top-level config.json says ("gemma3" for wrappers)
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  DType dtype = DType::kBFloat16;  // the checkpoint's declared dtype (torch_dtype / dtype)
  std::vector<LayerSpec> layers;
  nlohmann::json config;       // the full config.json
  nlohmann::json text_config;  // the part describing the language model

  std::vector<int64_t> global_layer_ids() const;
  const LayerSpec& layer(int64_t id) const;
  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
};

// Reads fields of a config with errors that name the file and field. `where` is shown in
// messages, typically "<dir>/config.json".
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& config, std::string where)
      : config_(config), where_(std::move(where)) {}

  bool has(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_double(std::string_view key) const;
  double get_double(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;
  std::vector<std::string> get_string_list(std::string_view key) const;
  std::vector<int64_t> get_int_list(std::string_view key) const;
  const nlohmann::json& get(std::string_view key) const;  // throws if absent
  const nlohmann::json& json() const { return config_; }
  const std::string& where() const { return where_; }
  // Positive integer field; error names the field when it is zero/negative.
  int64_t get_positive_int(std::string_view key) const;
  int64_t get_positive_int(std::string_view key, int64_t fallback) const;
  [[noreturn]] void fail(std::string_view key, std::string_view message) const;

 private:
  const nlohmann::json& config_;
  std::string where_;
};

}  // namespace headwise::arch
