// Dense Llama (`llama`) and Qwen3 (`qwen3`): the all-global baselines. Mirrors transformers
// 5.17 models/llama/modeling_llama.py and models/qwen3/modeling_qwen3.py. They differ only in
// Qwen3's q/k RMSNorms over head_dim (before RoPE), its optional sliding window on layers
// >= max_window_layers, Llama's optional MLP biases, and their config defaults.
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

// Config with the HF class defaults filled in (LlamaConfig / Qwen3Config).
struct DenseConfig {
  bool qwen3 = false;  // q/k norms, optional sliding window
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, sliding_window = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false, attention_bias = false, mlp_bias = false;
  std::vector<LayerKind> kinds;
  RopeParameters rope;
};

// Qwen3Config.__post_init__: the window exists only with use_sliding_window, and without
// layer_types it covers layers i >= max_window_layers. A layer typed sliding while the window
// is off runs full attention there (Qwen3Attention sets sliding_window = None).
std::vector<LayerKind> read_qwen3_kinds(const ConfigReader& r, int64_t num_layers, int64_t window) {
  if (r.has("layer_types")) {
    std::vector<LayerKind> kinds = read_attention_layer_kinds(r, num_layers, "Qwen3");
    if (window <= 0) kinds.assign(kinds.size(), LayerKind::kFullAttention);
    return kinds;
  }
  std::vector<LayerKind> kinds;
  const int64_t max_window_layers = r.get_int("max_window_layers", 28);
  for (int64_t i = 0; i < num_layers; ++i) {
    kinds.push_back(window > 0 && i >= max_window_layers ? LayerKind::kSlidingAttention
                                                         : LayerKind::kFullAttention);
  }
  return kinds;
}

DenseConfig read_dense_config(const ConfigReader& r) {
  DenseConfig c;
  c.qwen3 = r.get_string("model_type") == "qwen3";
  c.vocab_size = r.get_positive_int("vocab_size", c.qwen3 ? 151936 : 32000);
  c.hidden_size = r.get_positive_int("hidden_size", 4096);
  c.intermediate_size = r.get_positive_int("intermediate_size", c.qwen3 ? 22016 : 11008);
  c.num_layers = r.get_positive_int("num_hidden_layers", 32);
  c.num_heads = r.get_positive_int("num_attention_heads", 32);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", c.num_heads);
  c.head_dim = r.get_positive_int("head_dim", c.qwen3 ? 128 : c.hidden_size / c.num_heads);
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.attention_bias = r.get_bool("attention_bias", false);
  c.mlp_bias = !c.qwen3 && r.get_bool("mlp_bias", false);  // Qwen3MLP has no biases
  if (r.get_string("hidden_act", "silu") != "silu") r.fail("hidden_act", "must be silu");
  if (r.get_int("pretraining_tp", 1) != 1)
    throw_unsupported("{}: field 'pretraining_tp' != 1 is not supported", r.where());
  if (c.qwen3 && r.get_bool("use_sliding_window", false))
    c.sliding_window = r.get_positive_int("sliding_window", 4096);
  c.kinds = c.qwen3 ? read_qwen3_kinds(r, c.num_layers, c.sliding_window)
                    : std::vector<LayerKind>(static_cast<size_t>(c.num_layers),
                                             LayerKind::kFullAttention);
  c.rope = read_single_rope_parameters(r, 10000.0);
  return c;
}

ModelSpec build_dense_spec(const ConfigReader& r) {
  return attention_stack_spec_of(read_dense_config(r));
}

class DenseModel final : public DecoderModel {
 public:
  DenseModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
             const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_dense_config(text_config_reader())),
        inv_freq_(rope_inv_freq(config_.rope, config_.head_dim, device())) {}

  at::Tensor embed(const at::Tensor& input_ids) override { return embed_tokens(input_ids); }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    const double eps = config_.rms_norm_eps;
    const at::Tensor h =
        hidden + attention(layer,
                           rms_norm(hidden, layer_tensor(layer, "input_layernorm.weight"), eps,
                                    NormStyle::kScaleAfterCast),
                           run);
    const at::Tensor x = rms_norm(h, layer_tensor(layer, "post_attention_layernorm.weight"), eps,
                                  NormStyle::kScaleAfterCast);
    const at::Tensor gate = layer_linear(layer, "mlp.gate_proj", x, config_.mlp_bias);
    const at::Tensor up = layer_linear(layer, "mlp.up_proj", x, config_.mlp_bias);
    return h + layer_linear(layer, "mlp.down_proj", arch::silu(gate) * up, config_.mlp_bias);
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, "model.norm.weight", config_.rms_norm_eps,
                         NormStyle::kScaleAfterCast, config_.tie_word_embeddings);
  }

  std::vector<WeightRequirement> required_weights() const override {
    const DenseConfig& c = config_;
    const int64_t h = c.hidden_size;
    WeightList weights = decoder_weights(outer_weights_of(c));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights layer = weights.layer(i);
      layer.attention("self_attn.", attention_projections_of(c, c.attention_bias));
      layer.gated_mlp("mlp.", h, c.intermediate_size, c.mlp_bias);
      layer.add("input_layernorm.weight", {h});
      layer.add("post_attention_layernorm.weight", {h});
      if (c.qwen3) {
        layer.add("self_attn.q_norm.weight", {c.head_dim});
        layer.add("self_attn.k_norm.weight", {c.head_dim});
      }
    }
    return std::move(weights).take();
  }

 private:
  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    const bool bias = config_.attention_bias;
    auto heads = [&](const char* name, int64_t n) {
      return layer_linear(layer, name, x, bias).view({batch, steps, n, hd});
    };
    at::Tensor q = heads("self_attn.q_proj", config_.num_heads);
    at::Tensor k = heads("self_attn.k_proj", config_.num_kv_heads);
    if (config_.qwen3) {
      q = rms_norm(q, layer_tensor(layer, "self_attn.q_norm.weight"), config_.rms_norm_eps,
                   NormStyle::kScaleAfterCast);
      k = rms_norm(k, layer_tensor(layer, "self_attn.k_norm.weight"), config_.rms_norm_eps,
                   NormStyle::kScaleAfterCast);
    }
    const RotaryTable table = rotary_table(inv_freq_, run.position_offset, steps,
                                           rope_attention_factor(config_.rope), q.scalar_type());
    const bool sliding = config_.kinds[static_cast<size_t>(layer)] == LayerKind::kSlidingAttention;
    return attend_and_project(
        {.layer_id = layer,
         .q = apply_rotary(q.transpose(1, 2), table),
         .k = apply_rotary(k.transpose(1, 2), table),
         .v = heads("self_attn.v_proj", config_.num_kv_heads).transpose(1, 2),
         .scaling = std::pow(static_cast<double>(hd), -0.5),  // HF: head_dim**-0.5
         .sliding_window = sliding ? config_.sliding_window : 0},
        run, "self_attn.o_proj", bias);
  }

  DenseConfig config_;
  at::Tensor inv_freq_;
};

}  // namespace

static RegisterArchitecture llama_registration{
    Architecture{"llama", {"llama"}, build_dense_spec, create_model_of<DenseModel>}};
static RegisterArchitecture qwen3_registration{
    Architecture{"qwen3", {"qwen3"}, build_dense_spec, create_model_of<DenseModel>}};

}  // namespace headwise::arch
