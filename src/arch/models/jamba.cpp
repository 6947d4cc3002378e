// Jamba (`jamba`): Mamba-1 layers with attention (no RoPE) iff i % attn_layer_period ==
// attn_layer_offset, and a MoE feed-forward (softmax over all experts, top-k, no renormalisation,
// no shared expert) iff i % expert_layer_period == expert_layer_offset, a SwiGLU elsewhere.
// Mamba-1 keeps conv (intermediate, K) and SSM (intermediate, state) states. Mirrors transformers
// 5.17 models/jamba/modeling_jamba.py: its mixer normalises dt, B and C (RMSNorm) before the
// selective scan, which runs token by token as transformers' torch fallback does.
#include <cmath>

#include "headwise/arch/gated_delta.hpp"
#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/moe.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"

namespace headwise::arch {
namespace {

// JambaConfig with its class defaults (transformers 5.17).
struct JambaConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, num_experts = 0, top_k = 0;
  int64_t mamba_intermediate = 0, conv_kernel = 4, state_size = 16, dt_rank = 0;
  int64_t expert_period = 2, expert_offset = 1;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false, conv_bias = true, proj_bias = false;
  std::vector<LayerKind> kinds;
};

JambaConfig read_jamba_config(const ConfigReader& r) {
  JambaConfig c;
  c.num_layers = r.get_positive_int("num_hidden_layers", 32);
  const int64_t period = r.get_positive_int("attn_layer_period", 8);
  const int64_t offset = r.get_int("attn_layer_offset", 4);
  if (offset < 0 || offset >= period) {
    r.fail("attn_layer_offset",
           fmt::format("({}) must be in [0, attn_layer_period = {})", offset, period));
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.kinds.push_back(i % period == offset ? LayerKind::kFullAttention : LayerKind::kMamba);
  }
  c.expert_period = r.get_positive_int("expert_layer_period", 2);
  c.expert_offset = r.get_int("expert_layer_offset", 1);
  if (c.expert_offset < 0 || c.expert_offset >= c.expert_period) {
    r.fail("expert_layer_offset", fmt::format("({}) must be in [0, expert_layer_period = {})",
                                              c.expert_offset, c.expert_period));
  }
  c.vocab_size = r.get_positive_int("vocab_size", 65536);
  c.hidden_size = r.get_positive_int("hidden_size", 4096);
  c.intermediate_size = r.get_positive_int("intermediate_size", 14336);
  c.num_heads = r.get_positive_int("num_attention_heads", 32);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", 8);
  c.head_dim = c.hidden_size / c.num_heads;  // JambaAttention
  c.num_experts = r.get_positive_int("num_experts", 16);
  c.top_k = r.get_positive_int("num_experts_per_tok", 2);
  if (c.top_k > c.num_experts) r.fail("num_experts_per_tok", "exceeds num_experts");
  c.mamba_intermediate = read_mamba_expand_intermediate(r);
  c.conv_kernel = r.get_positive_int("mamba_d_conv", 4);
  c.state_size = r.get_positive_int("mamba_d_state", 16);
  // JambaConfig: "auto" is ceil(hidden_size / 16).
  c.dt_rank = read_int_or_auto(r, "mamba_dt_rank").value_or((c.hidden_size + 15) / 16);
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.conv_bias = r.get_bool("mamba_conv_bias", true);
  c.proj_bias = r.get_bool("mamba_proj_bias", false);
  if (r.get_string("hidden_act", "silu") != "silu") r.fail("hidden_act", "must be silu");
  return c;
}

bool is_expert_layer(const JambaConfig& c, int64_t layer) {
  return c.num_experts > 1 && layer % c.expert_period == c.expert_offset;
}

ModelSpec build_jamba_spec(const ConfigReader& config) {
  const JambaConfig c = read_jamba_config(config);
  return stack_layers(
      c.kinds, {.attention = read_attention_shape(config),
                .recurrent_states = mamba1_states(c.mamba_intermediate, c.conv_kernel, c.state_size,
                                                  config_dtype(config))});
}

// The selective scan (mamba_selective_scan's sequential path) over x, dt [B, I, T] with
// A [I, N] (negative), B and C [B, T, N]; `state` [B, I, N] fp32 is continued from when defined
// and holds the last state on return. The discretised A and B*u are built a block of tokens at a
// time, so memory stays O(B * I * N * block), not O(T).
at::Tensor selective_scan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                          const at::Tensor& B, const at::Tensor& C, at::Tensor& state) {
  constexpr int64_t kBlock = 128;
  const int64_t batch = x.size(0), channels = x.size(1), steps = x.size(2), n = A.size(-1);
  const at::ScalarType dtype = x.scalar_type();
  at::Tensor h = state.defined() ? state.to(at::kFloat)
                                 : at::zeros({batch, channels, n}, x.options().dtype(at::kFloat));
  std::vector<at::Tensor> outputs;
  outputs.reserve(static_cast<size_t>(steps));
  for (int64_t t0 = 0; t0 < steps; t0 += kBlock) {
    const int64_t t1 = std::min(steps, t0 + kBlock);
    const at::Tensor d = dt.slice(2, t0, t1);  // [B, I, b]
    const at::Tensor discrete_A =
        at::exp(A.unsqueeze(0).unsqueeze(2) * d.unsqueeze(-1));  // [B, I, b, N]
    const at::Tensor discrete_B = d.unsqueeze(-1) * B.slice(1, t0, t1).unsqueeze(1).to(at::kFloat);
    const at::Tensor delta_B_u = discrete_B * x.slice(2, t0, t1).unsqueeze(-1).to(at::kFloat);
    for (int64_t i = 0; i < t1 - t0; ++i) {
      h = discrete_A.select(2, i) * h + delta_B_u.select(2, i);
      outputs.push_back(at::matmul(h.to(dtype), C.select(1, t0 + i).unsqueeze(-1)).squeeze(-1));
    }
  }
  state = h;
  return at::stack(outputs, -1);  // [B, I, T]
}

class JambaModel final : public DecoderModel {
 public:
  JambaModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
             const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_jamba_config(text_config_reader())) {}

  at::Tensor embed(const at::Tensor& input_ids) override { return embed_tokens(input_ids); }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    const bool attention_layer =
        config_.kinds[static_cast<size_t>(layer)] == LayerKind::kFullAttention;
    return pre_norm_residual(
        hidden, layer_tensor(layer, "input_layernorm.weight"),
        layer_tensor(layer, "pre_ff_layernorm.weight"), config_.rms_norm_eps,
        NormStyle::kScaleAfterCast,
        [&](const at::Tensor& x) {
          return attention_layer ? attention(layer, x, run) : mamba(layer, x, run.state);
        },
        [&](const at::Tensor& y) { return feed_forward(layer, y); });
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, "model.final_layernorm.weight", config_.rms_norm_eps,
                         NormStyle::kScaleAfterCast, config_.tie_word_embeddings);
  }

  std::vector<WeightRequirement> required_weights() const override {
    const JambaConfig& c = config_;
    const int64_t h = c.hidden_size, mi = c.mamba_intermediate;
    WeightList weights = decoder_weights(outer_weights_of(c, "model.final_layernorm.weight"));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights layer = weights.layer(i);
      if (c.kinds[static_cast<size_t>(i)] == LayerKind::kFullAttention) {
        layer.attention("self_attn.", attention_projections_of(c));
      } else {
        layer.linear("mamba.in_proj", 2 * mi, h, c.proj_bias);
        layer.add("mamba.conv1d.weight", {mi, 1, c.conv_kernel});
        if (c.conv_bias) layer.add("mamba.conv1d.bias", {mi});
        layer.linear("mamba.x_proj", c.dt_rank + 2 * c.state_size, mi);
        layer.linear("mamba.dt_proj", mi, c.dt_rank, /*bias=*/true);
        layer.add("mamba.A_log", {mi, c.state_size});
        layer.add("mamba.D", {mi});
        layer.add("mamba.dt_layernorm.weight", {c.dt_rank});
        layer.add("mamba.b_layernorm.weight", {c.state_size});
        layer.add("mamba.c_layernorm.weight", {c.state_size});
        layer.linear("mamba.out_proj", h, mi, c.proj_bias);
      }
      if (is_expert_layer(c, i)) {
        layer.add("feed_forward.router.weight", {c.num_experts, h});
        for (int64_t e = 0; e < c.num_experts; ++e) {
          layer.gated_mlp(fmt::format("feed_forward.experts.{}.", e), h, c.intermediate_size);
        }
      } else {
        layer.gated_mlp("feed_forward.", h, c.intermediate_size);
      }
      layer.add("input_layernorm.weight", {h});
      layer.add("pre_ff_layernorm.weight", {h});
    }
    return std::move(weights).take();
  }

 private:
  at::Tensor feed_forward(int64_t layer, const at::Tensor& y) {
    if (!is_expert_layer(config_, layer)) {
      return gated_mlp(y, layer_tensor(layer, "feed_forward.gate_proj.weight"),
                       layer_tensor(layer, "feed_forward.up_proj.weight"),
                       layer_tensor(layer, "feed_forward.down_proj.weight"));
    }
    SparseMoeWeights w;
    w.router = layer_tensor(layer, "feed_forward.router.weight");
    w.expert = [this, layer](int64_t e) {
      const std::string p = fmt::format("feed_forward.experts.{}.", e);
      ExpertWeights ew;
      ew.gate = layer_tensor(layer, p + "gate_proj.weight");
      ew.up = layer_tensor(layer, p + "up_proj.weight");
      ew.down = layer_tensor(layer, p + "down_proj.weight");
      return ew;
    };
    return sparse_moe_block(y, w, config_.top_k, /*norm_topk_prob=*/false);
  }

  // JambaMambaMixer: in_proj to (x, gate); SiLU causal conv of x; x_proj to (dt, B, C), each
  // RMS-normalised; dt_proj (its bias joins inside the softplus); the selective scan; D skip;
  // gate with SiLU(gate); out_proj.
  at::Tensor mamba(int64_t layer, const at::Tensor& input, LayerState* state) {
    const JambaConfig& c = config_;
    const int64_t batch = input.size(0);
    const double eps = c.rms_norm_eps;
    const at::ScalarType dtype = input.scalar_type();
    const auto x_and_gate =
        layer_linear(layer, "mamba.in_proj", input, c.proj_bias).transpose(1, 2).chunk(2, 1);
    at::Tensor conv_state =
        find_layer_state(state, "conv_state", {batch, c.mamba_intermediate, c.conv_kernel});
    at::Tensor ssm_state =
        find_layer_state(state, "ssm_state", {batch, c.mamba_intermediate, c.state_size});
    const at::Tensor conv_bias =
        c.conv_bias ? layer_tensor(layer, "mamba.conv1d.bias") : at::Tensor();
    const at::Tensor x =
        at::silu(causal_conv1d(x_and_gate[0], layer_tensor(layer, "mamba.conv1d.weight"), conv_bias,
                               state != nullptr ? &conv_state : nullptr))
            .to(dtype);  // [B, I, T]
    const auto parts = arch::linear(x.transpose(1, 2), layer_tensor(layer, "mamba.x_proj.weight"))
                           .split_with_sizes({c.dt_rank, c.state_size, c.state_size}, -1);
    const at::Tensor time_step =
        rms_norm(parts[0], layer_tensor(layer, "mamba.dt_layernorm.weight"), eps,
                 NormStyle::kScaleAfterCast);
    const at::Tensor B = rms_norm(parts[1], layer_tensor(layer, "mamba.b_layernorm.weight"), eps,
                                  NormStyle::kScaleAfterCast);
    const at::Tensor C = rms_norm(parts[2], layer_tensor(layer, "mamba.c_layernorm.weight"), eps,
                                  NormStyle::kScaleAfterCast);
    // HF: dt_proj.weight @ dt^T (the bias is added inside the scan, in fp32, before the softplus).
    const at::Tensor& dt_proj = layer_tensor(layer, "mamba.dt_proj.weight");
    at::Tensor dt;
    {
      const SmallGemmOnOneThread pinned(dt_proj.size(0), time_step.size(1),
                                        time_step.is_cpu());  // per sequence
      dt = at::matmul(dt_proj, time_step.transpose(1, 2));
    }
    dt = at::softplus(dt + layer_tensor(layer, "mamba.dt_proj.bias")
                               .to(at::kFloat)
                               .to(dt.scalar_type())
                               .unsqueeze(-1));
    const at::Tensor A = -at::exp(layer_tensor(layer, "mamba.A_log").to(at::kFloat));
    at::Tensor scan = selective_scan(x, dt, A, B, C, ssm_state);
    scan = scan + x * layer_tensor(layer, "mamba.D").to(at::kFloat).view({1, -1, 1});
    scan = scan * at::silu(x_and_gate[1]);
    if (state != nullptr) {
      store_layer_state(*state, "conv_state", conv_state);
      store_layer_state(*state, "ssm_state", ssm_state);
    }
    return layer_linear(layer, "mamba.out_proj", scan.transpose(1, 2).to(dtype), c.proj_bias);
  }

  // JambaAttention: GQA without positional encoding.
  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    auto heads = [&](const char* name, int64_t n) {
      return layer_linear(layer, name, x, false).view({batch, steps, n, hd}).transpose(1, 2);
    };
    return attend_and_project({.layer_id = layer,
                               .q = heads("self_attn.q_proj", config_.num_heads),
                               .k = heads("self_attn.k_proj", config_.num_kv_heads),
                               .v = heads("self_attn.v_proj", config_.num_kv_heads),
                               .scaling = std::pow(static_cast<double>(hd), -0.5)},
                              run, "self_attn.o_proj", false);
  }

  JambaConfig config_;
};

const RegisterArchitecture kRegister(
    {"jamba", {"jamba"}, build_jamba_spec, create_model_of<JambaModel>});

}  // namespace
}  // namespace headwise::arch
