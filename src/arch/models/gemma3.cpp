// Gemma 3 text (`gemma3_text`, Gemma3ForCausalLM) and its multimodal wrapper (`gemma3`,
// text part under `text_config`). Mirrors transformers 5.17 models/gemma3/modeling_gemma3.py:
// interleaved sliding/global attention with two RoPE tables, zero-centred (1 + w) RMSNorms
// around both sub-blocks, q/k norms before RoPE, scaling query_pre_attn_scalar^-1/2,
// optional final logit soft-capping, GELU-tanh MLP, tied head.
// `attn_logit_softcapping` is read by Gemma3Attention but never passed to the attention
// function (unlike Gemma 2), so transformers ignores it; so do we (released Gemma 3 sets null).
#include <cmath>
#include <string>
#include <vector>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/rope_params.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {
namespace {

// The text config with Gemma3TextConfig's defaults filled in: released configs rely on them
// (gemma-3-27b's text_config names neither vocab_size nor rope_theta nor the layer pattern).
struct Gemma3Config {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, sliding_window = 0;
  double rms_norm_eps = 1e-6, query_pre_attn_scalar = 256;
  double final_logit_softcap = 0;  // 0 = off
  bool tie_word_embeddings = true;
  std::vector<LayerKind> kinds;
  RopeParameters global_rope, local_rope;
};

double optional_softcap(const ConfigReader& r, std::string_view key) {
  const double c = r.get_double(key, 0.0);
  if (c < 0) r.fail(key, "must be positive or null");
  return c;
}

std::vector<LayerKind> read_layer_kinds(const ConfigReader& r, int64_t num_layers) {
  if (r.has("layer_types")) return read_attention_layer_kinds(r, num_layers, "Gemma 3");
  // Legacy: every `sliding_window_pattern`-th layer is global (5 local : 1 global by default).
  // v5 also saves `_sliding_window_pattern`, but HF's __post_init__ reads only this key.
  const int64_t pattern = r.get_positive_int("sliding_window_pattern", 6);
  std::vector<LayerKind> kinds;
  for (int64_t i = 0; i < num_layers; ++i) {
    kinds.push_back((i + 1) % pattern != 0 ? LayerKind::kSlidingAttention
                                           : LayerKind::kFullAttention);
  }
  return kinds;
}

// HF's Gemma3TextConfig.convert_rope_params_to_dict: per-layer-type `rope_parameters`, with a
// legacy `rope_scaling` merged into the global (full_attention) entry only; thetas default to
// `rope_theta` / `rope_local_base_freq`, else 1e6 / 1e4.
void read_gemma3_rope(const ConfigReader& r, Gemma3Config& c) {
  RopeParameters global_base, local_base;
  global_base.theta = r.get_double("rope_theta", 1e6);
  local_base.theta = r.get_double("rope_local_base_freq", 1e4);
  nlohmann::json global = nlohmann::json::object(), local = nlohmann::json::object();
  if (r.has("rope_parameters")) {
    const auto& params = r.get("rope_parameters");
    if (!params.is_object()) r.fail("rope_parameters", "must be an object");
    if (params.contains("full_attention") && !params["full_attention"].is_null())
      global = params["full_attention"];
    if (params.contains("sliding_attention") && !params["sliding_attention"].is_null())
      local = params["sliding_attention"];
  }
  if (r.has("rope_scaling")) {
    const auto& scaling = r.get("rope_scaling");
    if (!scaling.is_object()) r.fail("rope_scaling", "must be an object");
    global.update(scaling);
  }
  c.global_rope = read_rope_object(r, global, global_base, "rope_parameters.full_attention");
  c.local_rope = read_rope_object(r, local, local_base, "rope_parameters.sliding_attention");
}

Gemma3Config read_gemma3_config(const ConfigReader& r) {
  Gemma3Config c;
  c.vocab_size = r.get_positive_int("vocab_size", 262208);
  c.hidden_size = r.get_positive_int("hidden_size", 2304);
  c.intermediate_size = r.get_positive_int("intermediate_size", 9216);
  c.num_layers = r.get_positive_int("num_hidden_layers", 26);
  c.num_heads = r.get_positive_int("num_attention_heads", 8);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", 4);
  c.head_dim = r.get_positive_int("head_dim", 256);
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-6);
  c.query_pre_attn_scalar = r.get_double("query_pre_attn_scalar", 256);
  if (!(c.query_pre_attn_scalar > 0)) r.fail("query_pre_attn_scalar", "must be positive");
  c.sliding_window = r.get_positive_int("sliding_window", 4096);
  c.final_logit_softcap = optional_softcap(r, "final_logit_softcapping");
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", true);
  if (r.get_string("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh") {
    r.fail("hidden_activation", "must be gelu_pytorch_tanh (the only activation Gemma 3 uses)");
  }
  // Both change the forward (biases; a bidirectional window of W/2 + 1); no released Gemma 3
  // text model sets them, so refuse rather than compute something else.
  if (r.get_bool("attention_bias", false))
    throw_unsupported("{}: field 'attention_bias' = true is not supported", r.where());
  if (r.get_bool("use_bidirectional_attention", false)) {
    throw_unsupported("{}: field 'use_bidirectional_attention' = true is not supported", r.where());
  }
  c.kinds = read_layer_kinds(r, c.num_layers);
  read_gemma3_rope(r, c);
  return c;
}

ModelSpec build_gemma3_spec(const ConfigReader& r) {
  return attention_stack_spec_of(read_gemma3_config(r));
}

class Gemma3Model final : public DecoderModel {
 public:
  Gemma3Model(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
              const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_gemma3_config(text_config_reader())),
        prefix_(find_prefix()),
        global_inv_freq_(rope_inv_freq(config_.global_rope, config_.head_dim, device())),
        local_inv_freq_(rope_inv_freq(config_.local_rope, config_.head_dim, device())) {}

  at::Tensor embed(const at::Tensor& input_ids) override {
    const at::Tensor& table = weight(-1, prefix_ + "embed_tokens.weight");
    // HF multiplies by sqrt(H) cast to the weight dtype: bf16 rounds it (sqrt(3072) -> 55.5).
    const at::Tensor scale =
        at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)),
                          at::TensorOptions().dtype(at::kFloat).device(device()))
            .to(table.scalar_type());
    return at::embedding(table, input_ids.to(device(), at::kLong)) * scale;
  }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    const double eps = config_.rms_norm_eps;
    at::Tensor attn = attention(
        layer, rms_norm(hidden, w(layer, "input_layernorm.weight"), eps, NormStyle::kOnePlusWeight),
        run);
    // Gemma 3 normalises each sub-block's output before the residual add.
    at::Tensor h = hidden + rms_norm(attn, w(layer, "post_attention_layernorm.weight"), eps,
                                     NormStyle::kOnePlusWeight);
    const at::Tensor x =
        rms_norm(h, w(layer, "pre_feedforward_layernorm.weight"), eps, NormStyle::kOnePlusWeight);
    const at::Tensor m =
        gated_mlp(x, w(layer, "mlp.gate_proj.weight"), w(layer, "mlp.up_proj.weight"),
                  w(layer, "mlp.down_proj.weight"), /*gelu=*/true);
    return h + rms_norm(m, w(layer, "post_feedforward_layernorm.weight"), eps,
                        NormStyle::kOnePlusWeight);
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    const int64_t top = spec().num_layers();
    const at::Tensor h = rms_norm(hidden, weight(top, prefix_ + "norm.weight"),
                                  config_.rms_norm_eps, NormStyle::kOnePlusWeight);
    at::Tensor out = arch::linear(h, head_weight());
    // Soft-capping runs in the activation dtype, as HF does before the caller's .float().
    const double c = config_.final_logit_softcap;
    if (c > 0) out = at::tanh(out / c) * c;
    return out.to(at::kFloat);
  }

  std::vector<WeightRequirement> required_weights() const override {
    const Gemma3Config& c = config_;
    const int64_t h = c.hidden_size;
    WeightList weights = decoder_weights({.vocab_size = c.vocab_size,
                                          .hidden_size = h,
                                          .tied = c.tie_word_embeddings,
                                          .embedding = prefix_ + "embed_tokens.weight",
                                          .final_norm = prefix_ + "norm.weight",
                                          .head = head_name()},
                                         prefix_);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights layer = weights.layer(i);
      layer.attention("self_attn.", attention_projections_of(c));
      layer.add("self_attn.q_norm.weight", {c.head_dim});
      layer.add("self_attn.k_norm.weight", {c.head_dim});
      layer.gated_mlp("mlp.", h, c.intermediate_size);
      for (const char* norm : {"input_layernorm", "post_attention_layernorm",
                               "pre_feedforward_layernorm", "post_feedforward_layernorm"}) {
        layer.add(fmt::format("{}.weight", norm), {h});
      }
    }
    return std::move(weights).take();
  }

 private:
  // Text weights sit under `model.` (Gemma3ForCausalLM), `model.language_model.` (wrapper,
  // transformers >= 4.52) or `language_model.model.` (older wrapper uploads).
  std::string find_prefix() const {
    for (const char* prefix : {"model.", "model.language_model.", "language_model.model."}) {
      if (has_weight(std::string(prefix) + "embed_tokens.weight")) return prefix;
    }
    return "model.";  // validate_weights names the missing tensor
  }

  std::string head_name() const {
    return prefix_ == "language_model.model." ? "language_model.lm_head.weight" : "lm_head.weight";
  }

  const at::Tensor& head_weight() {
    // Tied: the embedding table doubles as the head (HF ignores any stored lm_head).
    if (config_.tie_word_embeddings) return weight(-1, prefix_ + "embed_tokens.weight");
    return weight(spec().num_layers(), head_name());
  }

  const at::Tensor& w(int64_t layer, std::string_view name) {
    return layer_tensor(layer, name, prefix_);
  }

  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    const bool sliding = config_.kinds[static_cast<size_t>(layer)] == LayerKind::kSlidingAttention;
    const double eps = config_.rms_norm_eps;
    auto heads = [&](const char* proj, int64_t n) {
      return arch::linear(x, w(layer, proj)).view({batch, steps, n, hd}).transpose(1, 2);
    };
    at::Tensor q = rms_norm(heads("self_attn.q_proj.weight", config_.num_heads),
                            w(layer, "self_attn.q_norm.weight"), eps, NormStyle::kOnePlusWeight);
    at::Tensor k = rms_norm(heads("self_attn.k_proj.weight", config_.num_kv_heads),
                            w(layer, "self_attn.k_norm.weight"), eps, NormStyle::kOnePlusWeight);
    // Sliding layers use the local base frequency without scaling; global ones rope_theta
    // with rope_scaling.
    const RotaryTable table = rotary_table(
        sliding ? local_inv_freq_ : global_inv_freq_, run.position_offset, steps,
        rope_attention_factor(sliding ? config_.local_rope : config_.global_rope), q.scalar_type());
    return attend_and_project(
        {.layer_id = layer,
         .q = apply_rotary(q, table),
         .k = apply_rotary(k, table),
         .v = heads("self_attn.v_proj.weight", config_.num_kv_heads),
         .scaling =
             std::pow(config_.query_pre_attn_scalar, -0.5),  // HF: query_pre_attn_scalar**-0.5
         .logit_softcap = 0,  // see the file comment: transformers ignores attn_logit_softcapping
         .sliding_window = sliding ? config_.sliding_window : 0},
        run, "self_attn.o_proj", false, prefix_);
  }

  Gemma3Config config_;
  std::string prefix_;
  at::Tensor global_inv_freq_, local_inv_freq_;
};

}  // namespace

// "gemma3" is listed too: text_config_of names a wrapper's text part "gemma3_text", but a
// wrapper config whose text part says nothing else still resolves here.
static RegisterArchitecture gemma3_registration{Architecture{
    "gemma3", {"gemma3_text", "gemma3"}, build_gemma3_spec, create_model_of<Gemma3Model>}};

}  // namespace headwise::arch
