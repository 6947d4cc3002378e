// Config-level spec of the Qwen hybrids (no weights, no torch): layer kinds, attention shapes
// and linear-attention decode state, for the public Qwen3-Next-80B-A3B config and the
// v5 / wrapper spellings of the same fields.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/test_paths.hpp"
#include "headwise/arch/model_spec.hpp"
#include "headwise/arch/qwen_hybrid_config.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"

using namespace headwise;
using headwise::arch::LayerKind;

namespace {

nlohmann::json qwen3_next_80b() {
  std::ifstream in(std::string(HEADWISE_SOURCE_DIR) + "/tests/configs/qwen3_next_80b_a3b.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("Qwen3-Next-80B-A3B spec: 36 DeltaNet + 12 gated attention layers", "[arch]") {
  const auto spec = arch::build_model_spec(qwen3_next_80b(), "qwen3_next_80b_a3b.json");
  CHECK(spec.model_type == "qwen3_next");
  CHECK(spec.num_layers() == 48);
  CHECK(spec.hidden_size == 2048);
  CHECK(spec.vocab_size == 151936);
  CHECK(spec.dtype == DType::kBFloat16);
  CHECK(spec.global_layer_ids() ==
        std::vector<int64_t>{3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47});
  int64_t state_bytes = 0;
  for (const auto& layer : spec.layers) {
    if (layer.id % 4 == 3) {
      REQUIRE(layer.kind == LayerKind::kFullAttention);
      REQUIRE(layer.attention.has_value());
      CHECK(layer.attention->num_heads == 16);
      CHECK(layer.attention->num_kv_heads == 2);
      CHECK(layer.attention->head_dim == 256);
      CHECK(layer.attention->sliding_window == 0);
      CHECK(layer.states.empty());
      continue;
    }
    REQUIRE(layer.kind == LayerKind::kLinearAttention);
    CHECK_FALSE(layer.attention.has_value());
    REQUIRE(layer.states.size() == 2);
    // conv over [q | k | v] = 2*16*128 + 32*128 channels, last K=4 inputs, model dtype.
    CHECK(layer.states[0].name == "conv_state");
    CHECK(layer.states[0].shape == std::vector<int64_t>{8192, 4});
    CHECK(layer.states[0].dtype == DType::kBFloat16);
    CHECK(layer.states[0].state_class == arch::StateClass::kLinearState);
    CHECK(layer.states[1].name == "recurrent_state");
    CHECK(layer.states[1].shape == std::vector<int64_t>{32, 128, 128});
    CHECK(layer.states[1].dtype == DType::kFloat32);
    CHECK(layer.states[1].bytes_per_sequence() == 2 * 1024 * 1024);
    for (const auto& s : layer.states) state_bytes += s.bytes_per_sequence();
  }
  CHECK(state_bytes == 36 * (8192 * 4 * 2 + 2 * 1024 * 1024));
}

TEST_CASE("Qwen hybrid config: v5 and legacy spellings give the same spec", "[arch]") {
  const nlohmann::json legacy = qwen3_next_80b();
  nlohmann::json v5 = legacy;
  v5.erase("full_attention_interval");
  v5.erase("rope_theta");
  v5.erase("partial_rotary_factor");
  v5.erase("rope_scaling");
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  v5["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}};
  v5["layer_types"] = nlohmann::json::array();
  for (int i = 0; i < 48; ++i)
    v5["layer_types"].push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  const arch::ConfigReader a(legacy, "legacy"), b(v5, "v5");
  const auto ca = arch::read_qwen_hybrid_config(a, arch::QwenFeedForward::kSparseStep),
             cb = arch::read_qwen_hybrid_config(b, arch::QwenFeedForward::kSparseStep);
  CHECK((ca.layer_kinds == cb.layer_kinds));
  CHECK(ca.rope_theta == cb.rope_theta);
  CHECK(ca.rotary_dim() == 64);
  CHECK(cb.rotary_dim() == 64);
  CHECK(ca.is_moe_layer(0));
  CHECK(ca.num_experts == 512);

  SECTION("absent rope fields take HF's defaults (theta 1e4, factor 0.25)") {
    nlohmann::json bare = legacy;
    bare.erase("rope_theta");
    bare.erase("partial_rotary_factor");
    const arch::ConfigReader r(bare, "bare");
    const auto c = arch::read_qwen_hybrid_config(r, arch::QwenFeedForward::kSparseStep);
    CHECK(c.rope_theta == 10000.0);
    CHECK(c.rotary_dim() == 64);
  }
  SECTION("mlp_only_layers and decoder_sparse_step pick dense layers") {
    nlohmann::json mixed = legacy;
    mixed["mlp_only_layers"] = {0, 5};
    mixed["decoder_sparse_step"] = 2;
    const arch::ConfigReader r(mixed, "mixed");
    const auto c = arch::read_qwen_hybrid_config(r, arch::QwenFeedForward::kSparseStep);
    CHECK_FALSE(c.is_moe_layer(0));
    CHECK(c.is_moe_layer(1));
    CHECK_FALSE(c.is_moe_layer(2));
    CHECK_FALSE(c.is_moe_layer(5));
    CHECK(c.is_moe_layer(7));
  }
}

TEST_CASE("qwen3_5 wrapper config: text_config is the model", "[arch]") {
  nlohmann::json text = qwen3_next_80b();
  for (const char* key :
       {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "mlp_only_layers",
        "shared_expert_intermediate_size", "decoder_sparse_step", "norm_topk_prob"}) {
    text.erase(key);
  }
  text.erase("model_type");
  text.erase("torch_dtype");
  text["num_hidden_layers"] = 8;
  text["linear_conv_kernel_dim"] = 3;
  const nlohmann::json wrapper = {
      {"model_type", "qwen3_5"}, {"text_config", text}, {"dtype", "float16"}};
  const auto spec = arch::build_model_spec(wrapper, "wrapper/config.json");
  CHECK(spec.model_type == "qwen3_5_text");
  CHECK(spec.config_model_type == "qwen3_5");
  CHECK(spec.num_layers() == 8);
  CHECK(spec.global_layer_ids() == std::vector<int64_t>{3, 7});
  CHECK(spec.layer(0).states[0].shape == std::vector<int64_t>{8192, 3});
  CHECK(spec.layer(0).states[0].dtype == DType::kFloat16);  // inherited from the wrapper
}

TEST_CASE("Qwen hybrid config errors name the file and field", "[arch]") {
  nlohmann::json config = qwen3_next_80b();
  SECTION("missing field") {
    config.erase("hidden_size");
    REQUIRE_THROWS_WITH(arch::build_model_spec(config, "m/config.json"),
                        Catch::Contains("m/config.json") && Catch::Contains("'hidden_size'"));
  }
  SECTION("value heads not a multiple of key heads") {
    config["linear_num_value_heads"] = 24;
    config["linear_num_key_heads"] = 16;
    REQUIRE_THROWS_WITH(arch::build_model_spec(config, "m/config.json"),
                        Catch::Contains("'linear_num_value_heads'"));
  }
  SECTION("layer_types of the wrong length") {
    config["layer_types"] = {"linear_attention", "full_attention"};
    REQUIRE_THROWS_WITH(arch::build_model_spec(config, "m/config.json"),
                        Catch::Contains("'layer_types'"));
  }
  SECTION("unknown layer type") {
    config["num_hidden_layers"] = 2;
    config["layer_types"] = {"linear_attention", "sliding_attention"};
    REQUIRE_THROWS_WITH(arch::build_model_spec(config, "m/config.json"),
                        Catch::Contains("sliding_attention"));
  }
  SECTION("unsupported rope type") {
    config["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 1e7}, {"factor", 4.0}};
    REQUIRE_THROWS_AS(arch::build_model_spec(config, "m/config.json"), UnsupportedError);
  }
}
