#pragma once
// Building blocks for architecture spec builders: the decode states of the recurrent mixers
// (Mamba-1, Mamba-2, short convolution) and the attention shape, as the reference HF cache
// (transformers 5.17, torch path) allocates them. tools/check_state_shapes.py prints what
// the real caches hold; tests/arch/state_shapes_test.cpp encodes those facts.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/core/dtype.hpp"

namespace headwise::arch {

// The checkpoint's declared dtype ("dtype", else "torch_dtype"; "auto"/absent → bfloat16):
// conv states are kept in the activation dtype, so builders need it before build_model_spec
// fills ModelSpec::dtype.
DType config_dtype(const ConfigReader& config);

// Mamba-2 mixer (Bamba, GraniteMoeHybrid, NemotronH, Falcon-H1): conv state (conv_dim, K) with
// conv_dim = intermediate + 2 * groups * state_size, in the model dtype (HF keeps K inputs, not
// K - 1), and SSM state (heads, head_dim, state_size) in `ssm_dtype` (the torch scan returns
// float32 states and the cache keeps them as returned).
struct Mamba2Shape {
  int64_t intermediate = 0;  // heads * head_dim
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t groups = 0;
  int64_t state_size = 0;
  int64_t conv_kernel = 0;
};
std::vector<StateTensorSpec> mamba2_states(const Mamba2Shape& shape, DType conv_dtype,
                                           DType ssm_dtype);
// Checks intermediate == heads * head_dim and that groups divide heads; errors name `where`.
void validate_mamba2(const Mamba2Shape& shape, const ConfigReader& config);

// mamba_expand (default 2) * hidden_size: the Mamba intermediate size of Jamba, BambaMixer
// configs and Falcon-H1 with a null mamba_d_ssm.
int64_t read_mamba_expand_intermediate(const ConfigReader& config);
// The Mamba-2 fields under BambaConfig's names and defaults, which GraniteMoeHybrid (it runs
// BambaMixer) and Falcon-H1 share; only the intermediate size is found differently. head_dim
// "auto" means intermediate / heads. Validated.
Mamba2Shape read_bamba_mamba2_shape(const ConfigReader& config, int64_t intermediate);

// Mamba-1 mixer (Jamba): conv state (intermediate, K) in the model dtype, SSM state
// (intermediate, state_size) in float32.
std::vector<StateTensorSpec> mamba1_states(int64_t intermediate, int64_t conv_kernel,
                                           int64_t state_size, DType conv_dtype);

// LFM2 gated short convolution: conv state (hidden, L) in the model dtype.
std::vector<StateTensorSpec> short_conv_states(int64_t hidden, int64_t l_cache, DType conv_dtype);

// num_attention_heads, num_key_value_heads (default: num_attention_heads) and head_dim
// (default hidden_size / num_attention_heads, which must divide). Global (sliding_window 0).
AttentionShape read_attention_shape(const ConfigReader& config);
// The same with a sliding window of `window` tokens (the decoding token included); between
// steps the cache holds window - 1 of them, as HF's DynamicSlidingWindowLayer does.
AttentionShape sliding_attention_shape(AttentionShape shape, int64_t window);

// A positive integer field that may also be "auto" (Bamba's mamba_d_head): nullopt when
// absent, null or "auto".
std::optional<int64_t> read_int_or_auto(const ConfigReader& config, std::string_view key);

// Layer kind list of `layer_types`-style configs, checked against num_hidden_layers.
std::vector<std::string> read_layer_types(const ConfigReader& config, std::string_view key,
                                          int64_t num_layers);

}  // namespace headwise::arch
