// Decode-state facts of the config-level architectures, as tools/check_state_shapes.py printed
// them from transformers 5.17's real caches (the tiny configs in tools/check_state_shapes.py,
// bfloat16, torch path): conv states keep K inputs in the model dtype, SSM/recurrent states are
// float32, sliding layers hold their window.
#include <catch2/catch.hpp>

#include "../test_configs.hpp"
#include "headwise/core/error.hpp"

using namespace headwise;
using headwise::testing::spec_from_config;

namespace {

void require_state(const arch::LayerSpec& layer, size_t index, const std::string& name,
                   std::vector<int64_t> shape, DType dtype) {
  INFO("layer " << layer.id << " state " << index);
  REQUIRE(layer.states.size() > index);
  CHECK(layer.states[index].name == name);
  CHECK(layer.states[index].shape == shape);
  CHECK(layer.states[index].dtype == dtype);
}

// Kind names (torch's operator<< for vectors cannot print an enum vector).
std::vector<std::string> kinds(const arch::ModelSpec& spec) {
  std::vector<std::string> out;
  for (const auto& l : spec.layers) out.push_back(std::string(arch::layer_kind_name(l.kind)));
  return out;
}

}  // namespace

TEST_CASE(
    "bamba: mamba2 conv (I+2GN, K) bf16 and ssm (nh, P, N) fp32; attention at attn_layer_indices",
    "[arch]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  CHECK(kinds(spec) ==
        std::vector<std::string>{"mamba", "full_attention", "mamba", "full_attention"});
  // check_state_shapes.py: conv_states [2, 192, 4] bfloat16, recurrent_states [2, 8, 16, 16]
  // float32
  require_state(spec.layer(0), 0, "conv_state", {192, 4}, DType::kBFloat16);
  require_state(spec.layer(0), 1, "ssm_state", {8, 16, 16}, DType::kFloat32);
  CHECK(spec.layer(0).states[0].state_class == arch::StateClass::kSsmState);
  CHECK(spec.layer(1).attention->num_kv_heads == 2);
  CHECK(spec.layer(1).attention->head_dim == 16);
  CHECK(spec.global_layer_ids() == std::vector<int64_t>{1, 3});
}

TEST_CASE("granitemoehybrid: layer_types mamba/attention, conv (160, 4)", "[arch]") {
  const auto spec = spec_from_config("granitemoehybrid_tiny.json");
  CHECK(kinds(spec) == std::vector<std::string>{"mamba", "full_attention", "mamba", "mamba"});
  require_state(spec.layer(3), 0, "conv_state", {160, 4}, DType::kBFloat16);
  require_state(spec.layer(3), 1, "ssm_state", {8, 16, 16}, DType::kFloat32);
}

TEST_CASE("nemotron_h: pattern M-M*E, MLP/MoE blocks keep nothing, ssm in mamba_ssm_cache_dtype",
          "[arch]") {
  const auto spec = spec_from_config("nemotron_h_tiny.json");
  CHECK(kinds(spec) == std::vector<std::string>{"mamba", "mlp", "mamba", "full_attention", "mlp"});
  require_state(spec.layer(0), 0, "conv_state", {128, 4}, DType::kBFloat16);
  require_state(spec.layer(2), 1, "ssm_state", {8, 8, 16}, DType::kFloat32);
  CHECK(spec.layer(1).states.empty());
  CHECK(spec.layer(4).states.empty());
  CHECK(spec.layer(3).attention->head_dim == 16);

  auto config = read_json_file(headwise::testing::config_dir() / "nemotron_h_tiny.json");
  config["mamba_ssm_cache_dtype"] = "bfloat16";
  CHECK(arch::build_model_spec(config, "x").layer(0).states[1].dtype == DType::kBFloat16);
  config["hybrid_override_pattern"] = "M-X";
  CHECK_THROWS_WITH(arch::build_model_spec(config, "cfg.json"),
                    Catch::Contains("cfg.json") && Catch::Contains("hybrid_override_pattern") &&
                        Catch::Contains("'X'"));
}

TEST_CASE("gpt_oss: even layers sliding, the cache keeps window - 1 tokens between steps",
          "[arch]") {
  const auto spec = spec_from_config("gpt_oss_tiny.json");
  CHECK(kinds(spec) == std::vector<std::string>{"sliding_attention", "full_attention"});
  CHECK(spec.layer(0).attention->sliding_window == 4);
  CHECK(spec.layer(0).attention->sliding_cache_tokens ==
        3);  // tools/check_state_shapes.py: HF holds W - 1
  CHECK(spec.layer(0).is_sliding());
  CHECK(spec.global_layer_ids() == std::vector<int64_t>{1});
}

TEST_CASE("lfm2: conv layers keep (hidden, L) in the model dtype", "[arch]") {
  const auto spec = spec_from_config("lfm2_tiny.json");
  CHECK(kinds(spec) == std::vector<std::string>{"conv", "conv", "full_attention", "conv"});
  require_state(spec.layer(0), 0, "conv_state", {64, 3}, DType::kBFloat16);
  CHECK(spec.layer(0).states.size() == 1);
  CHECK(spec.layer(0).states[0].state_class == arch::StateClass::kOtherState);
}

TEST_CASE("jamba: mamba1 conv (I, K) and ssm (I, N) fp32; attention at offset of period",
          "[arch]") {
  const auto spec = spec_from_config("jamba_tiny.json");
  CHECK(kinds(spec) == std::vector<std::string>{"mamba", "mamba", "full_attention", "mamba"});
  require_state(spec.layer(0), 0, "conv_state", {128, 4}, DType::kBFloat16);
  require_state(spec.layer(0), 1, "ssm_state", {128, 8}, DType::kFloat32);
}

TEST_CASE("falcon_h1: every layer is global attention plus mamba2 states", "[arch]") {
  const auto spec = spec_from_config("falcon_h1_tiny.json");
  for (const auto& layer : spec.layers) {
    CHECK(layer.is_global());
    require_state(layer, 0, "conv_state", {96, 4}, DType::kBFloat16);
    require_state(layer, 1, "ssm_state", {4, 16, 8}, DType::kFloat32);
  }
  CHECK(spec.global_layer_ids() == std::vector<int64_t>{0, 1});
}

TEST_CASE("config-level builders name the file and field on bad input", "[arch]") {
  auto config = read_json_file(headwise::testing::config_dir() / "bamba_tiny.json");
  config["attn_layer_indices"] = {1, 9};
  CHECK_THROWS_AS(arch::build_model_spec(config, "b.json"), InputError);
  CHECK_THROWS_WITH(arch::build_model_spec(config, "b.json"),
                    Catch::Contains("b.json") && Catch::Contains("attn_layer_indices"));
  config["attn_layer_indices"] = {1};
  config["mamba_d_head"] = 7;
  CHECK_THROWS_WITH(arch::build_model_spec(config, "b.json"), Catch::Contains("mamba head_dim"));
  auto lfm = read_json_file(headwise::testing::config_dir() / "lfm2_tiny.json");
  lfm["layer_types"] = {"conv", "full_attention"};
  CHECK_THROWS_WITH(arch::build_model_spec(lfm, "l.json"),
                    Catch::Contains("layer_types") && Catch::Contains("4"));
  auto jamba = read_json_file(headwise::testing::config_dir() / "jamba_tiny.json");
  jamba["attn_layer_offset"] = 4;
  CHECK_THROWS_WITH(arch::build_model_spec(jamba, "j.json"), Catch::Contains("attn_layer_offset"));
}
