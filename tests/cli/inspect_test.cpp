// headwise-calc inspect: what a user reads before calibrating (layer kinds, weight bytes, full-KV
// bytes), in JSON and text, with and without a checkpoint, and its bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "../support/temp_dir.hpp"
#include "../support/test_paths.hpp"

using headwise::testing::run_cli;
using headwise::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = fs::path(HEADWISE_FIXTURES_DIR) / "gemma3_gqa4";

// The tensor bytes of a safetensors file: its size less the 8-byte header length and the header.
int64_t safetensors_data_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  uint64_t header = 0;
  in.read(reinterpret_cast<char*>(&header), sizeof header);
  return static_cast<int64_t>(fs::file_size(file)) - 8 - static_cast<int64_t>(header);
}

nlohmann::json inspect_json(const fs::path& model) {
  const auto run = run_cli("inspect --model " + model.string() + " --context 4k --json");
  INFO(run.err);
  REQUIRE(run.status == 0);
  return nlohmann::json::parse(run.out);
}

}  // namespace

TEST_CASE("inspect: weight bytes from the checkpoint, null without one; full KV as mem-estimate's",
          "[cli]") {
  const auto j = inspect_json(kFixture);
  CHECK(j.at("model_type") == "gemma3_text");
  CHECK(j.at("forward") == true);
  CHECK(j.at("weights_bytes").get<int64_t>() ==
        safetensors_data_bytes(kFixture / "model.safetensors"));
  CHECK(j.at("global_layers") == nlohmann::json::array({2}));
  CHECK(j.at("layers").size() == 4);
  const auto estimate =
      run_cli("mem-estimate --model " + kFixture.string() + " --context 4k --full-kv --json");
  INFO(estimate.err);
  REQUIRE(estimate.status == 0);
  CHECK(j.at("full_kv_total_bytes") == nlohmann::json::parse(estimate.out).at("total_bytes"));

  // config.json alone: the same layers and bytes, and no weights to count.
  TempDir dir("inspect-config-only");
  fs::copy_file(kFixture / "config.json", dir / "config.json");
  const auto config_only = inspect_json(dir.path());
  CHECK(config_only.at("weights_bytes").is_null());
  CHECK(config_only.at("full_kv_total_bytes") == j.at("full_kv_total_bytes"));
  CHECK(config_only.at("layers") == j.at("layers"));
  const auto text = run_cli("inspect --model " + dir.path().string() + " --context 4k");
  REQUIRE(text.status == 0);
  CHECK_THAT(text.out, Catch::Contains("no weights"));
  CHECK_THAT(run_cli("inspect --model " + kFixture.string() + " --context 4k").out,
             Catch::Contains("weights 1.04 MiB"));
}

TEST_CASE("inspect refuses bad input in one line", "[cli]") {
  TempDir dir("inspect-refused");
  for (const auto& [args, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"--model " + (dir / "missing").string(), "missing"},
           {"--model " + kFixture.string() + " --context 0", "--context"},
           {"--model " + kFixture.string() + " --batch 0", "--batch"},
           {"--model " + kFixture.string() + " --kv-dtype int3", "--kv-dtype"},
       }) {
    INFO(args);
    const auto run = run_cli("inspect " + args + " --json");
    CHECK(run.status == 1);
    CHECK(run.out.empty());
    CHECK_THAT(run.err, Catch::Contains(fragment));
    CHECK(std::count(run.err.begin(), run.err.end(), '\n') == 1);
  }
}
