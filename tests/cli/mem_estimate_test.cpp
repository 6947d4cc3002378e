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
  const fs::path dir = fs::temp_directory_path() / ("headwise_cli_" + config + (with_weights ? "_w" : ""));
  fs::create_directories(dir);
  fs::copy_file(headwise::testing::config_dir() / config, dir / "config.json", fs::copy_options::overwrite_existing);
  if (with_weights) {
    const std::string header = R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})";
    std::ofstream f(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(12, '\0');
  }
  return dir;
}

}  // namespace

TEST_CASE("mem-estimate --json: full KV on bamba tiny", "[cli]") {
  const auto dir = model_dir("bamba_tiny.json");
  const Run r = run_cli("mem-estimate --model " + dir.string() + " --full-kv --context 100 --batch 3 --json");
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
  Run r = run_cli("mem-estimate --model " + dir.string() +
                  " --uniform-window 10 --context 100 --batch 3 --sink-tokens 4 --block-size 1 --json");
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["components"]["global_kv_bytes"] == 3 * 4 * 896);
  CHECK(j["weights_bytes"] == 12);
  CHECK(j["layers"][1]["kv_head_windows"] == nlohmann::json::array({10, 10}));

  // budget = 200000 - 12 - 1000 bytes; full KV grows 256 B/token/sequence beyond the states
  r = run_cli("mem-estimate --model " + dir.string() + " --uniform-window 10 --context 1k --gpu-memory 200000 "
              "--reserve 1000 --json");
  REQUIRE(r.status == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["gpu_fit"]["cache_budget_bytes"] == 200000 - 12 - 1000);
  CHECK(j["gpu_fit"]["policy"]["max_context"].is_null());  // finite windows: never outgrows the budget
  // full KV at batch 1: 19456 B of states + ceil(C/16)*16 * 256 B ≤ 198988 → C ≤ 16*43 = 688
  CHECK(j["gpu_fit"]["full_kv"]["max_context"] == 688);
  CHECK(j["gpu_fit"]["full_kv"]["max_batch"] == 198988 / (19456 + 1024 * 256));

  r = run_cli("mem-estimate --model " + dir.string() + " --full-kv --context 1k --gpu-memory 200000");
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
  p.per_layer_policies = {{1, {10, 10}, {}}, {3, {10, 10}, {}}};
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
  for (const auto& [args, expected] : cases) {
    const Run r = run_cli("mem-estimate" + args);
    INFO(args << " → " << r.err);
    CHECK(r.status == 1);
    CHECK(r.out.empty());
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
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
