// One regression test per fuzzing finding (tools/fuzz.sh; docs/hardening.md).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "../test_configs.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/json.hpp"
#include "headwise/io/safetensors.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;

namespace {

// The message of the InputError `fn` throws ("(accepted)" when it throws none; any other
// exception fails the test by escaping).
template <typename Fn>
std::string input_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

// fuzz_safetensors_header: a number beyond double range in the header made nlohmann throw
// out_of_range (not parse_error), which escaped as an internal error (exit 5).
TEST_CASE("fuzz: safetensors header with a number out of double range is an InputError", "[io]") {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,42e8544]}})";
  CHECK_THAT(
      input_error_of([&] { (void)io::parse_safetensors_header(header, 4, "m.safetensors"); }),
      Catch::Contains("m.safetensors: safetensors header is not valid JSON"));
}

// The same nlohmann behaviour in read_json_file (config.json, reports, checkpoints).
TEST_CASE("fuzz: a JSON file with a number out of double range is an InputError naming it",
          "[io]") {
  testing::TempDir dir;
  write_file_atomically(dir.path() / "config.json", R"({"hidden_size": 1e999})");
  CHECK_THAT(input_error_of([&] { (void)read_json_file(dir.path() / "config.json"); }),
             Catch::Contains("config.json: malformed JSON"));
}

// fuzz_config_spec: hidden_size 6.5e124 reached static_cast<int64_t>(double), undefined
// behaviour (UBSan), in ConfigReader::get_int; the same cast guarded in rope parameters.
TEST_CASE("fuzz: config integers beyond int64 are InputErrors naming the field", "[arch]") {
  nlohmann::json config = read_json_file(testing::config_dir() / "gpt_oss_tiny.json");
  config["hidden_size"] = 6.5e124;
  CHECK_THAT(input_error_of([&] { (void)arch::build_model_spec(config, "c.json"); }),
             Catch::Contains("c.json: field 'hidden_size' is out of range"));
  config["hidden_size"] = 18446744073709551615ULL;
  CHECK_THAT(input_error_of([&] { (void)arch::build_model_spec(config, "c.json"); }),
             Catch::Contains("field 'hidden_size' is out of range"));
  nlohmann::json llama =
      read_json_file(std::filesystem::path(HEADWISE_FIXTURES_DIR) / "llama_rope3" / "config.json");
  llama["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 1e30}};
  CHECK_THAT(input_error_of([&] { (void)arch::build_model_spec(llama, "l.json"); }),
             Catch::Contains("rope_scaling.original_max_position_embeddings' is out of range"));
}

// fuzz_config_spec (a hand-made deep input after the fuzzer's own were clean): 200k nested
// brackets in config.json parsed fine but overflowed the stack when ModelSpec copied the JSON.
TEST_CASE("fuzz: JSON nested beyond kMaxJsonDepth is an InputError, not a stack overflow", "[io]") {
  const std::string deep = R"({"model_type": "llama", "x": )" + std::string(200000, '[') +
                           std::string(200000, ']') + "}";
  CHECK_THAT(input_error_of([&] { (void)parse_json(deep, "c.json"); }),
             Catch::Contains("c.json: JSON nested deeper than 256 levels"));
  const std::string fine = R"({"a": )" + std::string(200, '[') + std::string(200, ']') + "}";
  CHECK(parse_json(fine, "c.json").contains("a"));
}

// fuzz_config_spec (2026-11-29, 10-minute run): granitemoehybrid with num_hidden_layers
// 31111111111 sized its per-layer list before any other check: a 1 TB allocation. Counts that
// size containers now have a ceiling far above any model.
TEST_CASE("fuzz: an absurd layer or head count is an InputError, not an allocation", "[arch]") {
  const nlohmann::json granite = {
      {"model_type", "granitemoehybrid"}, {"num_hidden_layers", 31111111111LL}, {"nume", 128}};
  CHECK_THAT(
      input_error_of([&] { (void)arch::build_model_spec(granite, "c.json"); }),
      Catch::Contains("c.json: field 'num_hidden_layers' is 31111111111, more than any model has"));
  nlohmann::json config = read_json_file(testing::config_dir() / "gpt_oss_tiny.json");
  config["num_attention_heads"] = 1LL << 40;
  config["num_key_value_heads"] = 1LL << 40;
  CHECK_THAT(input_error_of([&] { (void)arch::build_model_spec(config, "c.json"); }),
             Catch::Contains("is 1099511627776, more than any model has (at most 65536)"));
}

// fuzz_policy_yaml (2026-11-29, 10-minute run): a fingerprint digest "nu\xff\r" was accepted,
// written bare, and read back without its carriage return: the round trip changed the policy.
TEST_CASE("fuzz: a policy fingerprint must be a hex digest", "[policy]") {
  const std::string base =
      "schema: headwise/policy/v1\nmodel_name: m\nmodel_fingerprint:\n  config_sha256: ";
  const std::string rest =
      "\nbudget_gb: 1\ncontext: 4096\nbatch: 1\ndtype: bfloat16\nblock_size: 16\nsink_tokens: 0\n"
      "window_levels: [256, full]\nper_layer_policies: []\n";
  CHECK_THAT(
      input_error_of([&] { (void)policy::from_yaml(base + "\"nu\\xff\\r\"" + rest, "p.yaml"); }),
      Catch::Contains("p.yaml:4:18: model_fingerprint.config_sha256: is not a hex digest"));
  CHECK_THAT(input_error_of([&] { (void)policy::from_yaml(base + "ABC" + rest, "p.yaml"); }),
             Catch::Contains("is not a hex digest"));
  // The same run, a minute later: a policy without a fingerprint is written with an empty
  // digest, which must read back.
  const std::string no_fingerprint = "schema: headwise/policy/v1\nmodel_name: m\n" + rest;
  const policy::Policy first = policy::from_yaml(no_fingerprint, "p.yaml");
  const std::string written = policy::to_yaml(first);
  CHECK(policy::to_yaml(policy::from_yaml(written, "rewritten.yaml")) == written);
}
