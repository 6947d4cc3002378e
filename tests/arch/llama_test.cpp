// Dense Llama and Qwen3: parity with transformers on tiny random checkpoints
// (tools/fixtures/llama.py), legacy rope spellings, chunked attention, bad weights, specs.
#include <catch2/catch.hpp>

#include <cmath>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/rope_params.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

using namespace headwise;
using namespace headwise::testing;

namespace {

const char* const kDenseFixtures[] = {"llama_rope3", "llama_bias_tied", "qwen3_gqa",
                                      "qwen3_sliding", "qwen3_yarn"};

// bf16 against transformers' own bf16 run, relative to the logit scale: one bf16 ulp (2^-8).
// Measured on CPU: 0 for all four fixtures, fp32 too (see gemma3_test.cpp).
constexpr double kBf16Tolerance = 4e-3;

arch::ModelSpec spec_of(const nlohmann::json& config) {
  return arch::build_model_spec(config, "dir/config.json");
}

}  // namespace

TEST_CASE("llama and qwen3 match transformers in fp32", "[parity]") {
  for (const char* name : kDenseFixtures) {
    const auto err = compare(run_fixture(fixture_dir(name), {}),
                             read_reference(fixture_dir(name), "logits_fp32"));
    INFO(name << ": max abs err " << err.error << ", logit scale " << err.scale);
    CHECK(err.error <= 1e-4 * err.scale);
  }
}

TEST_CASE("llama and qwen3 match transformers in bf16", "[parity]") {
  arch::ModelOptions options;
  options.compute_dtype = DType::kBFloat16;
  for (const char* name : kDenseFixtures) {
    const auto err = compare(run_fixture(fixture_dir(name), options),
                             read_reference(fixture_dir(name), "logits_bf16"));
    INFO(name << ": bf16 max abs err " << err.error << ", logit scale " << err.scale);
    CHECK(err.error <= kBf16Tolerance * err.scale);
  }
}

TEST_CASE("qwen3 sliding layers in small query chunks give the same logits", "[parity]") {
  arch::ModelOptions options;
  options.attention_chunk = 5;  // < window 24, does not divide T = 96
  const auto fixture = fixture_dir("qwen3_sliding");
  const at::Tensor chunked = run_fixture(fixture, options);
  const auto err = compare(chunked, read_reference(fixture, "logits_fp32"));
  CHECK(err.error <= 1e-4 * err.scale);
  CHECK(max_abs_diff(chunked, run_fixture(fixture, {})) <= 1e-5 * err.scale);
}

TEST_CASE("llama legacy rope_theta + rope_scaling read like rope_parameters", "[parity]") {
  const auto fixture = fixture_dir("llama_rope3");
  TempDir dir;
  copy_fixture(fixture, dir.path(), [](nlohmann::json c) {
    auto rope = c["rope_parameters"];
    c.erase("rope_parameters");
    c["rope_theta"] = rope["rope_theta"];
    rope.erase("rope_theta");
    rope["type"] = rope["rope_type"];  // the oldest spelling
    rope.erase("rope_type");
    c["rope_scaling"] = rope;
    return c;
  });
  CHECK(max_abs_diff(run_fixture(fixture, {}, dir.path()), run_fixture(fixture, {})) == 0.0);
}

TEST_CASE("qwen3 YaRN is applied: the same weights with default RoPE give other logits",
          "[parity]") {
  const auto fixture = fixture_dir("qwen3_yarn");
  TempDir dir;
  copy_fixture(fixture, dir.path(), [](nlohmann::json c) {
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
    return c;
  });
  const auto err =
      compare(run_fixture(fixture, {}, dir.path()), read_reference(fixture, "logits_fp32"));
  CHECK(err.error > 1e-3 * err.scale);  // the fixture's positions reach past the original context
}

TEST_CASE("yarn's attention factor and ramp settings are read as transformers reads them",
          "[arch]") {
  const auto read = [](nlohmann::json rope) {
    const nlohmann::json config = {{"max_position_embeddings", 131072}, {"rope_scaling", rope}};
    return arch::read_single_rope_parameters(arch::ConfigReader(config, "config.json"), 1e6);
  };
  // Qwen3's published long-context setting.
  auto p =
      read({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}});
  CHECK(p.original_max_position_embeddings == 32768);
  CHECK(arch::rope_attention_factor(p) == Approx(0.1 * std::log(4.0) + 1.0).epsilon(1e-15));
  CHECK((p.beta_fast == 32.0 && p.beta_slow == 1.0 && p.truncate));
  // DeepSeek's spelling: the ratio of two mscales.
  p = read({{"type", "yarn"},
            {"factor", 40.0},
            {"mscale", 1.0},
            {"mscale_all_dim", 0.707},
            {"beta_fast", 0}});
  CHECK(arch::rope_attention_factor(p) ==
        Approx((0.1 * std::log(40.0) + 1.0) / (0.1 * 0.707 * std::log(40.0) + 1.0)).epsilon(1e-15));
  CHECK(p.beta_fast == 32.0);                           // HF's `or 32`
  CHECK(p.original_max_position_embeddings == 131072);  // filled from max_position_embeddings
  // gpt-oss: explicit attention factor, no truncation.
  p = read({{"rope_type", "yarn"},
            {"factor", 32.0},
            {"attention_factor", 1.25},
            {"truncate", false},
            {"original_max_position_embeddings", 4096}});
  CHECK((arch::rope_attention_factor(p) == 1.25 && !p.truncate));
  CHECK(arch::rope_attention_factor(read({{"rope_type", "linear"}, {"factor", 2.0}})) == 1.0);
  CHECK_THROWS_WITH(read({{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", "yes"}}),
                    Catch::Contains("rope_scaling.truncate"));
  CHECK_THROWS_WITH(read({{"rope_type", "yarn"}}), Catch::Contains("rope_scaling.factor"));
  CHECK_THROWS_WITH(read({{"rope_type", "longrope"}, {"factor", 4.0}}),
                    Catch::Contains("supported: default, linear, llama3, yarn"));
}

TEST_CASE("llama weights of the wrong shape or missing are named with their file", "[arch]") {
  const auto fixture = fixture_dir("llama_bias_tied");
  const auto keep = [](nlohmann::json c) { return c; };
  {
    TempDir dir;
    copy_fixture(fixture, dir.path(), keep, [](EditableTensor& t) {
      if (t.name == "model.layers.2.self_attn.v_proj.weight") t.shape = {64, 32};  // transposed
      return true;
    });
    require_load_error(dir.path(),
                       {"model.layers.2.self_attn.v_proj.weight", "model.safetensors", "[64, 32]"});
  }
  {
    TempDir dir;
    copy_fixture(fixture, dir.path(), keep,
                 [](EditableTensor& t) { return t.name != "model.layers.0.mlp.up_proj.bias"; });
    require_load_error(dir.path(), {"model.layers.0.mlp.up_proj.bias", "missing"});
  }
  {
    // Untied models need lm_head.weight.
    TempDir dir;
    copy_fixture(fixture, dir.path(), [](nlohmann::json c) {
      c["tie_word_embeddings"] = false;
      return c;
    });
    require_load_error(dir.path(), {"lm_head.weight", "missing"});
  }
}

TEST_CASE("llama spec: all layers global, head_dim from hidden/heads, GQA", "[arch]") {
  // Llama-3-8B's public values.
  const nlohmann::json config = {{"model_type", "llama"},
                                 {"hidden_size", 4096},
                                 {"intermediate_size", 14336},
                                 {"num_hidden_layers", 32},
                                 {"num_attention_heads", 32},
                                 {"num_key_value_heads", 8},
                                 {"vocab_size", 128256},
                                 {"rope_theta", 500000.0},
                                 {"max_position_embeddings", 131072},
                                 {"rope_scaling",
                                  {{"factor", 8.0},
                                   {"low_freq_factor", 1.0},
                                   {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 8192},
                                   {"rope_type", "llama3"}}},
                                 {"torch_dtype", "bfloat16"}};
  const auto spec = spec_of(config);
  REQUIRE(spec.num_layers() == 32);
  CHECK(spec.global_layer_ids().size() == 32);
  CHECK(spec.layer(31).attention->head_dim == 128);
  CHECK(spec.layer(0).attention->num_kv_heads == 8);
  CHECK(spec.vocab_size == 128256);
  CHECK(spec.dtype == DType::kBFloat16);

  auto bad = config;
  bad["rope_scaling"].erase("low_freq_factor");
  CHECK_THROWS_WITH(spec_of(bad), Catch::Contains("rope_scaling.low_freq_factor"));
  bad = config;
  bad["rope_scaling"]["rope_type"] = "dynamic";
  CHECK_THROWS_AS(spec_of(bad), UnsupportedError);
  bad = config;
  bad["hidden_act"] = "gelu";
  CHECK_THROWS_WITH(spec_of(bad), Catch::Contains("hidden_act"));
}

TEST_CASE("qwen3 spec: sliding only with use_sliding_window, from max_window_layers on", "[arch]") {
  nlohmann::json config = {
      {"model_type", "qwen3"},    {"hidden_size", 64},        {"num_hidden_layers", 6},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 128},
      {"sliding_window", 32},     {"max_window_layers", 4},   {"use_sliding_window", false}};
  auto spec = spec_of(config);
  CHECK(spec.global_layer_ids().size() == 6);
  CHECK(spec.layer(0).attention->head_dim == 128);  // Qwen3Config's default, not hidden/heads
  config["use_sliding_window"] = true;
  spec = spec_of(config);
  CHECK(spec.global_layer_ids() == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(spec.layer(4).kind == arch::LayerKind::kSlidingAttention);
  CHECK(spec.layer(5).attention->sliding_window == 32);
  CHECK(spec.layer(5).attention->sliding_cache_tokens == 31);
  // The saved fixture spells the same thing with layer_types.
  const auto fixture = arch::load_model_spec(fixture_dir("qwen3_sliding"));
  CHECK(fixture.global_layer_ids() == std::vector<int64_t>{0, 1});
  CHECK(fixture.layer(3).attention->sliding_window == 24);
}
