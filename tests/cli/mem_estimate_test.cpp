// headwise-calc mem-estimate end to end: JSON figures, the policy path, --gpu-memory, and bad
// input (one line, non-zero exit, nothing on stdout).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/temp_dir.hpp"
#include "../test_configs.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;
namespace fs = std::filesystem;

namespace {

using Run = headwise::testing::CliRun;
using headwise::testing::run_cli;

// A model folder holding `config` as config.json (and, when asked, a 12-byte safetensors file).
fs::path model_dir(const std::string& config, bool with_weights = false) {
  const fs::path dir =
      fs::temp_directory_path() / ("headwise_cli_" + config + (with_weights ? "_w" : ""));
  fs::create_directories(dir);
  fs::copy_file(headwise::testing::config_dir() / config, dir / "config.json",
                fs::copy_options::overwrite_existing);
  if (with_weights) {
    const std::string header = R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})";
    std::ofstream f(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(12, '\0');
  }
  return dir;
}

// Each (arguments, expected text): exit 1, nothing on stdout, one line on stderr naming it.
void expect_one_line_errors(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [args, expected] : cases) {
    const Run r = run_cli("mem-estimate" + args);
    INFO(args << " → " << r.err);
    CHECK(r.status == 1);
    CHECK(r.out.empty());
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

}  // namespace

TEST_CASE("mem-estimate --json: full KV on bamba tiny", "[cli]") {
  const auto dir = model_dir("bamba_tiny.json");
  const Run r =
      run_cli("mem-estimate --model " + dir.string() + " --full-kv --context 100 --batch 3 --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["total_bytes"] == 144384);  // hand-computed in memory_model_test
  CHECK(j["context"] == 100);
  CHECK(j["batch"] == 3);
  CHECK(j["block_size"] == 16);
  CHECK(j["kv_dtype"] == "bfloat16");
  CHECK(j["weights_bytes"].is_null());
  CHECK(j["full_kv_total_bytes"] == 144384);
  int64_t sum = 0;
  for (const auto& [k, v] : j["components"].items()) sum += v.get<int64_t>();
  CHECK(sum == 144384);
  REQUIRE(j["layers"].size() == 4);
  CHECK(j["layers"][0]["kind"] == "mamba");
  CHECK(j["layers"][0]["kv_head_windows"].is_null());
  CHECK(j["layers"][1]["kv_head_windows"] == nlohmann::json::array({"full", "full"}));
}

TEST_CASE("mem-estimate: uniform window, overrides, weights, --gpu-memory", "[cli]") {
  const auto dir = model_dir("bamba_tiny.json", true);
  Run r =
      run_cli("mem-estimate --model " + dir.string() +
              " --uniform-window 10 --context 100 --batch 3 --sink-tokens 4 --block-size 1 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["components"]["global_kv_bytes"] == 3 * 4 * 896);
  CHECK(j["weights_bytes"] == 12);
  CHECK(j["layers"][1]["kv_head_windows"] == nlohmann::json::array({10, 10}));

  // budget = 200000 - 12 - 1000 bytes; full KV grows 256 B/token/sequence beyond the states
  r = run_cli("mem-estimate --model " + dir.string() +
              " --uniform-window 10 --context 1k --gpu-memory 200000 "
              "--reserve 1000 --json");
  REQUIRE(r.status == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["gpu_fit"]["cache_budget_bytes"] == 200000 - 12 - 1000);
  CHECK(j["gpu_fit"]["policy"]["max_context"]
            .is_null());  // finite windows: never outgrows the budget
  // full KV at batch 1: 19456 B of states + ceil(C/16)*16 * 256 B ≤ 198988 → C ≤ 16*43 = 688
  CHECK(j["gpu_fit"]["full_kv"]["max_context"] == 688);
  CHECK(j["gpu_fit"]["full_kv"]["max_batch"] == 198988 / (19456 + 1024 * 256));

  r = run_cli("mem-estimate --model " + dir.string() +
              " --full-kv --context 1k --gpu-memory 200000");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("max context at batch 1") != std::string::npos);
  CHECK(r.out.find("global KV") != std::string::npos);
}

TEST_CASE("mem-estimate --config policy.yaml, with overrides", "[cli]") {
  const auto dir = model_dir("bamba_tiny.json");
  policy::Policy p;
  p.model_name = "bamba-tiny";
  p.model_path = dir.string();
  p.fingerprint = policy::fingerprint_model(dir);
  p.context = 100;
  p.batch = 3;
  p.window_levels = {10, policy::kFull};
  p.per_layer_policies = {{1, {10, 10}, {}, {}}, {3, {10, 10}, {}, {}}};
  p.sink_tokens = 4;
  p.block_size = 1;
  policy::fill_memory(p, headwise::testing::spec_from_config("bamba_tiny.json"));
  const fs::path file = dir / "policy.yaml";
  policy::write_policy(file, p);
  Run r = run_cli("mem-estimate --config " + file.string() + " --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["total_bytes"] == p.memory.total_bytes);
  CHECK(j["components"]["global_kv_bytes"] == 3 * 4 * 896);
  r = run_cli("mem-estimate --config " + file.string() + " --batch 1 --json");
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.out)["components"]["global_kv_bytes"] == 4 * 896);
  const int64_t native_states = j["components"]["ssm_state_bytes"];

  // The policy's state_dtype prices the states (the fixture's conv states are bf16 natively):
  // mem-estimate follows it, and --state-dtype native goes back to the architecture's dtypes.
  p.state_dtype = DType::kFloat32;
  policy::fill_memory(p, headwise::testing::spec_from_config("bamba_tiny.json"));
  policy::write_policy(file, p);
  r = run_cli("mem-estimate --config " + file.string() + " --json");
  REQUIRE(r.status == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["total_bytes"] == p.memory.total_bytes);
  CHECK(j["state_dtype"] == "float32");
  CHECK(j["components"]["ssm_state_bytes"].get<int64_t>() > native_states);
  CHECK(j["components"]["ssm_state_bytes"] == p.memory.components.ssm_state_bytes);
  r = run_cli("mem-estimate --config " + file.string() + " --state-dtype native --json");
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.out)["components"]["ssm_state_bytes"] == native_states);

  // a policy for another model: the fingerprint says so
  const auto other = model_dir("jamba_tiny.json");
  r = run_cli("mem-estimate --config " + file.string() + " --model " + other.string());
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(r.err.find("config_sha256") != std::string::npos);
}

TEST_CASE("mem-estimate bad input: one line, exit 1, nothing on stdout", "[cli]") {
  const auto dir = model_dir("bamba_tiny.json");
  const std::string m = " --model " + dir.string();
  const std::vector<std::pair<std::string, std::string>> cases{
      {m + " --full-kv --context 0", "--context"},
      {m + " --full-kv --context=-5", "--context"},
      {m + " --full-kv --context 12q", "--context"},
      {m + " --full-kv --context 1k --batch 0", "--batch"},
      {m + " --full-kv --context 1k --kv-dtype int3", "--kv-dtype"},
      {m + " --full-kv --context 1k --gpu-memory lots", "--gpu-memory"},
      {m + " --full-kv --context 1k --gpu-memory 80g", "--weights-bytes"},
      {m + " --full-kv", "--context"},
      {m + " --full-kv --uniform-window 4k --context 1k", "exactly one"},
      {" --full-kv --context 1k --model /nonexistent/model", "/nonexistent/model"},
      {" --config /nonexistent/policy.yaml", "/nonexistent/policy.yaml"},
  };
  expect_one_line_errors(cases);
  std::ofstream(dir / "broken.yaml") << "schema: headwise/policy/v1\nmodel_name: [oops\n";
  const Run r = run_cli("mem-estimate --config " + (dir / "broken.yaml").string());
  CHECK(r.status == 1);
  CHECK(r.err.find("broken.yaml:") != std::string::npos);
}

TEST_CASE("mem-estimate --help says sizes are powers of 1024", "[cli]") {
  const Run r = run_cli("mem-estimate --help");
  CHECK(r.status == 0);
  CHECK(r.out.find("powers of 1024") != std::string::npos);
}

TEST_CASE("mem-estimate --engine: headwise unchanged, vllm figures, both side by side", "[cli]") {
  const auto dir = model_dir("gpt_oss_20b.json");
  const std::string base = "mem-estimate --model " + dir.string() + " --full-kv --context 128k";
  // the default engine is headwise, byte for byte
  const Run plain = run_cli(base + " --json");
  const Run headwise = run_cli(base + " --json --engine headwise");
  REQUIRE(plain.status == 0);
  CHECK(headwise.out == plain.out);
  CHECK(run_cli(base + " --engine headwise").out == run_cli(base).out);
  CHECK(nlohmann::json::parse(plain.out).count("engine") == 0);

  // vLLM v0.25.1 rules: 12 * 32768 B * (8192 + 521) pages, hand-computed in vllm_model_test
  Run r = run_cli(base + " --engine vllm --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["engine"] == "vllm");
  CHECK(j["vllm_rules_version"] == "v0.25.1");
  CHECK(j["total_bytes"] == int64_t{3426091008});
  CHECK(j["max_num_batched_tokens"] == 8192);
  CHECK(j["mamba_cache_mode"] == "none");
  CHECK(j["max_model_len"] == 131072);
  CHECK(j["layers"][0]["bytes"] == 521 * 32768);
  CHECK(j["kv_cache_groups"].size() == 2);
  // --max-model-len is --context under vLLM's name
  CHECK(run_cli("mem-estimate --model " + dir.string() +
                " --full-kv --max-model-len 128k --engine vllm --json")
            .out == r.out);
  // a smaller batch budget: sliding layers reserve cdiv(127 + 2048, 16) + 1 = 137 pages
  r = run_cli(base + " --engine vllm --max-num-batched-tokens 2048 --json");
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.out)["layers"][0]["bytes"] == 137 * 32768);

  r = run_cli(base + " --engine both --json");
  REQUIRE(r.status == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["engine"] == "both");
  CHECK(j["headwise"] == nlohmann::json::parse(plain.out));
  CHECK(j["vllm"]["total_bytes"] == int64_t{3426091008});
  REQUIRE(j["difference"].is_array());
  for (const auto& d : j["difference"]) {
    INFO(d.dump());
    CHECK(d["difference_bytes"] ==
          d["vllm_bytes"].get<int64_t>() - d["headwise_bytes"].get<int64_t>());
    CHECK(d["why"].is_null() == (d["difference_bytes"] == 0));
  }
  CHECK(j["difference"][1]["component"] == "local (sliding) KV");
  // headwise keeps 127 tokens -> 128 slots * 2048 B per sliding layer; vLLM 521 pages of 32768 B
  CHECK(j["difference"][1]["headwise_bytes"] == 12 * 128 * 2048);
  CHECK(j["difference"][1]["vllm_bytes"] == 12 * 521 * 32768);

  r = run_cli(base + " --engine both");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("vLLM v0.25.1 allocation rules") != std::string::npos);
  CHECK(r.out.find("chunked prefill") != std::string::npos);

  // --gpu-memory answers for the chosen engine: 2 requests fit a budget of twice the reservation
  r = run_cli(base + " --engine vllm --gpu-memory " +
              std::to_string(int64_t{3426091008} * 2 + 100) + " --weights-bytes 100 --json");
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.out)["gpu_fit"]["full_kv"]["max_batch"] == 2);
}

TEST_CASE("mem-estimate --engine bad input: one line, exit 1, nothing on stdout", "[cli]") {
  const auto dir = model_dir("gpt_oss_20b.json");
  const std::string m = " --model " + dir.string() + " --full-kv";
  const std::vector<std::pair<std::string, std::string>> cases{
      {m + " --context 1k --engine sglang", "--engine"},
      {m + " --context 1k --max-model-len 2k --engine vllm", "--max-model-len"},
      {m + " --context 1k --engine vllm --max-num-batched-tokens 0", "--max-num-batched-tokens"},
      {m + " --context 1k --engine vllm --mamba-cache-mode sometimes", "--mamba-cache-mode"},
      {m + " --context 1k --max-num-batched-tokens 4096", "--engine"},
      {m + " --context 1k --engine both --sink-tokens 4", "--sink-tokens"},
  };
  expect_one_line_errors(cases);
}
