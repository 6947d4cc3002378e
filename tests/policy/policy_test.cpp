// policy.yaml: round trips, byte-identical writes, and the strict reader's errors.
#include <catch2/catch.hpp>

#include <regex>

#include "../test_configs.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"
#include "headwise/policy/policy.hpp"

#include <ATen/Context.h>

using namespace headwise;
using headwise::testing::spec_from_config;

namespace {

// A policy for bamba tiny (global layers 1 and 3, two KV heads each).
policy::Policy sample_policy() {
  const auto spec = spec_from_config("bamba_tiny.json");
  policy::Policy p;
  p.model_name = "bamba-tiny: test";
  p.model_path = "../configs";
  p.fingerprint.config_sha256 = "ab12";
  p.budget_gb = 0.5;
  p.context = 4096;
  p.batch = 2;
  p.dtype = DType::kBFloat16;
  p.block_size = 16;
  p.sink_tokens = 4;
  p.window_levels = {256, 1024, policy::kFull};
  p.calibration = {{"dataset_sha256", "00ff"},
                   {"samples", 64},
                   {"seq_len", 4096},
                   {"seed", 7},
                   {"tool_version", "0.1.0"},
                   {"distortion", "block_output_mse"},
                   {"numeric_string", "123"},
                   {"nested", {{"a", {1, 2}}, {"b", nullptr}, {"c", true}, {"d", 0.25}}}};
  p.per_layer_policies = {{1, {256, policy::kFull}, {0.125, 0.0}, {}}, {3, {1024, 1024}, {}, {}}};
  policy::fill_memory(p, spec);
  return p;
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("policy round-trips and writes byte-identically", "[policy]") {
  const policy::Policy p = sample_policy();
  const std::string yaml = policy::to_yaml(p);
  CHECK(yaml.find("schema: headwise/policy/v1") != std::string::npos);
  CHECK(yaml.find("kv_head_windows: [256, full]") != std::string::npos);
  CHECK(yaml.find("window_levels: [256, 1024, full]") != std::string::npos);
  const policy::Policy q = policy::from_yaml(yaml, "p.yaml");
  CHECK(policy::to_yaml(q) == yaml);
  CHECK(q.model_name == p.model_name);
  CHECK(q.calibration == p.calibration);
  CHECK(q.calibration["numeric_string"].is_string());
  CHECK(q.per_layer_policies[0].kv_head_windows == std::vector<int64_t>{256, policy::kFull});
  CHECK(q.per_layer_policies[0].expected_distortion == std::vector<double>{0.125, 0.0});
  CHECK(q.memory.total_bytes == p.memory.total_bytes);
  CHECK(q.non_global_layers.size() == 2);
  CHECK(q.non_global_layers[0].kind == "mamba");
  CHECK(!q.fingerprint.weights_headers_sha256);
  policy::validate_against_model(q, spec_from_config("bamba_tiny.json"), "p.yaml");

  const auto dir = std::filesystem::temp_directory_path() / "headwise_policy_test";
  std::filesystem::create_directories(dir);
  policy::write_policy(dir / "a.yaml", p);
  policy::write_policy(dir / "b.yaml", policy::read_policy(dir / "a.yaml"));
  CHECK(read_text_file(dir / "a.yaml") == read_text_file(dir / "b.yaml"));
  // Not remove_all: libtorch.so exports a broken copy of it that the dynamic linker may pick.
  for (const char* name : {"a.yaml", "b.yaml"}) std::filesystem::remove(dir / name);
}

TEST_CASE("state_dtype: absent means native (as before the field), present is written and priced",
          "[policy]") {
  // A policy written before the field (sample_policy has none): it reads, writes back byte for
  // byte without the field, and its memory is each state's native dtype (bamba: conv states in
  // the checkpoint's bf16, SSM state float32).
  const policy::Policy native = sample_policy();
  const std::string text = policy::to_yaml(native);
  CHECK(text.find("state_dtype") == std::string::npos);
  const policy::Policy read_native = policy::from_yaml(text, "old.yaml");
  CHECK_FALSE(read_native.state_dtype.has_value());
  CHECK_FALSE(read_native.memory_options().state_dtype.has_value());
  CHECK(policy::to_yaml(read_native) == text);

  const auto spec = spec_from_config("bamba_tiny.json");
  for (const DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    INFO(dtype_name(d));
    policy::Policy p = sample_policy();
    p.state_dtype = d;
    policy::fill_memory(p, spec);
    const std::string yaml = policy::to_yaml(p);
    CHECK(yaml.find(fmt::format("dtype: bfloat16\nstate_dtype: {}\n", dtype_name(d))) !=
          std::string::npos);
    const policy::Policy q = policy::from_yaml(yaml, "p.yaml");
    CHECK(q.state_dtype == d);
    CHECK(q.memory_options().state_dtype == d);
    CHECK(policy::to_yaml(q) == yaml);
    policy::validate_against_model(q, spec, "p.yaml");
    // Every state at the policy's dtype: two mamba layers, batch 2.
    int64_t per_sequence = 0;
    for (const auto& s : spec.layer(0).states)
      per_sequence += s.bytes_per_sequence() / element_size(s.dtype) * element_size(d);
    CHECK(p.memory.components.ssm_state_bytes == 2 * 2 * per_sequence);
    // The memory block is checked against the field: the native figures are stale here.
    if (p.memory.components.ssm_state_bytes != native.memory.components.ssm_state_bytes) {
      CHECK_THROWS_WITH(
          policy::validate_against_model(
              policy::from_yaml(
                  replace(text, "dtype: bfloat16\n",
                          fmt::format("dtype: bfloat16\nstate_dtype: {}\n", dtype_name(d))),
                  "p.yaml"),
              spec, "p.yaml"),
          Catch::Contains("memory.total_bytes"));
    }
  }
  CHECK_THROWS_WITH(
      policy::from_yaml(replace(text, "dtype: bfloat16\n", "dtype: bfloat16\nstate_dtype: int8\n"),
                        "p.yaml"),
      Catch::Contains("p.yaml: state_dtype") && Catch::Contains("not a state dtype"));
  CHECK_THROWS_WITH(
      policy::from_yaml(
          replace(text, "dtype: bfloat16\n", "dtype: bfloat16\nstate_dtype: native\n"), "p.yaml"),
      Catch::Contains("state_dtype"));  // native is spelled by leaving the field out
}

TEST_CASE("memory block equals the memory model", "[policy]") {
  const policy::Policy p = sample_policy();
  // layer 1: window 256 + 4 sinks → 272 slots; full → 4096; layer 3: 1024 + 4 → 1040 (block 16)
  // each slot: 16 * 2 * 2 B = 64; batch 2
  CHECK(p.memory.components.global_kv_bytes == 2 * 64 * (272 + 4096 + 1040 + 1040));
  // two mamba layers, 9728 B each per sequence
  CHECK(p.memory.components.ssm_state_bytes == 2 * 2 * 9728);
  CHECK(p.memory.total_bytes == p.memory.components.total());
  CHECK(p.non_global_layers[1].layer_id == 2);
  CHECK(p.non_global_layers[1].bytes == 2 * 9728);
}

TEST_CASE("strict reader: unknown keys, ladder, heads, layers, broken YAML", "[policy]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  const std::string yaml = policy::to_yaml(sample_policy());
  const auto read = [](const std::string& text) { return policy::from_yaml(text, "pol.yaml"); };

  CHECK_THROWS_WITH(
      read(replace(yaml, "batch: 2", "batch: 2\nbacth: 3")),
      Catch::Contains("pol.yaml") && Catch::Contains("bacth") && Catch::Contains("unknown key"));
  CHECK_THROWS_WITH(read(replace(yaml, "kv_head_windows: [1024, 1024]",
                                 "kv_head_windows: [1024, 1024]\n    extra: 1")),
                    Catch::Contains("per_layer_policies[1].extra"));
  CHECK_THROWS_WITH(
      read(replace(yaml, "kv_head_windows: [1024, 1024]", "kv_head_windows: [1024, 512]")),
      Catch::Contains("layer 3") && Catch::Contains("512 is not one of window_levels"));
  CHECK_THROWS_WITH(
      read(replace(yaml, "window_levels: [256, 1024, full]", "window_levels: [1024, 256, full]")),
      Catch::Contains("window_levels[1]"));
  CHECK_THROWS_WITH(read(replace(yaml, "schema: headwise/policy/v1", "schema: headwise/policy/v9")),
                    Catch::Contains("schema"));
  CHECK_THROWS_WITH(read(replace(yaml, "context: 4096", "context: -5")),
                    Catch::Contains("context"));
  CHECK_THROWS_WITH(read(replace(yaml, "context: 4096", "context: 4k")),
                    Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(read(replace(yaml, "context: 4096\n", "")),
                    Catch::Contains("context") && Catch::Contains("missing"));
  CHECK_THROWS_WITH(read(replace(yaml, "dtype: bfloat16", "dtype: bfloat17")),
                    Catch::Contains("dtype"));
  CHECK_THROWS_WITH(read("schema: [unclosed\n"),
                    Catch::Contains("pol.yaml:") && Catch::Contains("broken YAML"));
  CHECK_THROWS_WITH(read(std::regex_replace(yaml, std::regex("total_bytes: [0-9]+\n  global"),
                                            "total_bytes: 1\n  global")),
                    Catch::Contains("memory.total_bytes"));

  // against the model: wrong head count, non-global layer, missing layer, stale memory block
  const auto check = [&](const std::string& text) {
    policy::validate_against_model(read(text), spec, "pol.yaml");
  };
  CHECK_THROWS_WITH(
      check(replace(yaml, "kv_head_windows: [1024, 1024]", "kv_head_windows: [1024, 1024, 1024]")),
      Catch::Contains("layer_id 3") && Catch::Contains("2 KV heads"));
  CHECK_THROWS_WITH(
      check(replace(yaml, "layer_id: 3\n    kv", "layer_id: 2\n    kv")),
      Catch::Contains("layer_id 2") && Catch::Contains("not a global attention layer"));
  CHECK_THROWS_WITH(check(replace(yaml, "batch: 2", "batch: 3")),
                    Catch::Contains("memory.total_bytes") && Catch::Contains("stale"));
  auto p = sample_policy();
  p.per_layer_policies.pop_back();
  p.memory = {};
  p.non_global_layers.clear();
  CHECK_THROWS_WITH(policy::validate_against_model(p, spec, "pol.yaml"),
                    Catch::Contains("global layer 3 is missing"));
  CHECK_THROWS_AS(policy::read_policy("/nonexistent/policy.yaml"), InputError);
}

TEST_CASE("policies with h2o heads carry their rules and their selection bookkeeping", "[policy]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  policy::Policy p = sample_policy();
  // Layer 3's first head fills 1000 slots' worth of window by heavy hitters: not a ladder level.
  p.per_layer_policies[1].kv_head_windows = {1000, 1024};
  p.per_layer_policies[1].kv_head_rules = {policy::KeepRule::kH2O, policy::KeepRule::kWindow};
  policy::fill_memory(p, spec);
  CHECK(p.selecting_layers() == std::set<int64_t>{3});
  CHECK(p.window_heads_of_selecting_layers() == std::set<std::pair<int64_t, int64_t>>{{3, 1}});
  // Slots (1000 + 4 sinks → 1008, 1040; block 16) x (8 B position + 4 B score) + 3 x 8 B per head,
  // batch 2.
  CHECK(p.memory.components.selection_state_bytes == 2 * ((1008 + 1040) * 12 + 2 * 24));
  CHECK(p.memory.total_bytes == p.memory.components.total());
  const std::string yaml = policy::to_yaml(p);
  CHECK(yaml.find("kv_head_rules: [h2o, window]") != std::string::npos);
  CHECK(yaml.find("selection_state_bytes:") != std::string::npos);
  const policy::Policy q = policy::from_yaml(yaml, "p.yaml");
  CHECK(policy::to_yaml(q) == yaml);
  CHECK((q.per_layer_policies[1].kv_head_rules == p.per_layer_policies[1].kv_head_rules));
  CHECK(q.per_layer_policies[0].kv_head_rules.empty());
  policy::validate_against_model(q, spec, "p.yaml");
  // Window-only policies write neither key (their files keep their bytes).
  const std::string plain = policy::to_yaml(sample_policy());
  CHECK(plain.find("kv_head_rules") == std::string::npos);
  CHECK(plain.find("selection_state_bytes") == std::string::npos);

  const auto read = [](const std::string& text) { return policy::from_yaml(text, "pol.yaml"); };
  CHECK_THROWS_WITH(read(replace(yaml, "kv_head_rules: [h2o, window]", "kv_head_rules: [h2o]")),
                    Catch::Contains("layer 3") && Catch::Contains("kv_head_rules") &&
                        Catch::Contains("one rule per KV head"));
  CHECK_THROWS_WITH(
      read(replace(yaml, "kv_head_rules: [h2o, window]", "kv_head_rules: [h2o, snapkv]")),
      Catch::Contains("kv_head_rules[1]") && Catch::Contains("window, h2o"));
  // Only an h2o head may hold a window outside the ladder.
  CHECK_THROWS_WITH(
      read(replace(yaml, "kv_head_rules: [h2o, window]", "kv_head_rules: [window, window]")),
      Catch::Contains("kv_head_windows[0]") && Catch::Contains("1000 is not one of window_levels"));
  // The bookkeeping is checked against the model like every other component.
  CHECK_THROWS_WITH(
      policy::validate_against_model(
          read(std::regex_replace(yaml, std::regex("  selection_state_bytes: [0-9]+\n"), "")), spec,
          "pol.yaml"),
      Catch::Contains("memory.total_bytes"));
}

TEST_CASE("MKL's dynamic thread count is pinned where torch has MKL", "[core]") {
  // A GEMM that picks its threads from the machine's load is not reproducible (see
  // reproducible_math.hpp); libheadwise pins it when it loads.
  CHECK(pin_cpu_math_threads() == at::hasMKL());
}
