// NaN/Inf during calibration: a corrupted weight stops the run cleanly (exit 4, one line
// naming the layer and, for attention weights, the KV head) and writes nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "cli_helpers.hpp"

using namespace headwise;
using headwise::testing::CliRun;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture =
    fs::path(HEADWISE_FIXTURES_DIR) / "qwen3_gqa";  // F32, 2 KV heads of 32 dims

// A copy of the fixture whose tensor `name` has rows [row_begin, row_end) set to NaN.
void corrupt(const fs::path& out, const std::string& name, int64_t row_begin, int64_t row_end) {
  bool found = false;
  testing::copy_fixture(
      kFixture, out, [](nlohmann::json c) { return c; },
      [&](testing::EditableTensor& t) {
        if (t.name != name) return true;
        found = true;
        const int64_t cols = t.shape.at(1);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (int64_t i = row_begin * cols; i < row_end * cols; ++i)
          std::memcpy(&t.data[static_cast<size_t>(i) * 4], &nan, 4);
        return true;
      });
  REQUIRE(found);
  fs::copy_file(kFixture / "generation_config.json", out / "generation_config.json");
}

CliRun calibrate(const fs::path& model, const fs::path& output) {
  return testing::run_cli_with("--model " + model.string() +
                               " --context 4k --budget 1g --windows 16,64,full "
                               "--seq-len 128 --samples 2 -o " +
                               output.string() + " --quiet");
}

}  // namespace

TEST_CASE("a NaN in one KV head's value projection is reported with its layer and head", "[cli]") {
  testing::TempDir dir;
  corrupt(dir.path(), "model.layers.1.self_attn.v_proj.weight", 32, 64);  // KV head 1 of layer 1
  const CliRun r = calibrate(dir.path(), dir.path() / "p.yaml");
  INFO(r.err);
  CHECK(r.status == 4);
  CHECK(r.err.find("layer 1 KV head 1") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_FALSE(testing::exists(dir.path() / "p.yaml"));
}

TEST_CASE("a NaN in an MLP weight is caught in the layer's hidden state", "[cli]") {
  testing::TempDir dir;
  corrupt(dir.path(), "model.layers.0.mlp.down_proj.weight", 0, 1);
  const CliRun r = calibrate(dir.path(), dir.path() / "p.yaml");
  INFO(r.err);
  CHECK(r.status == 4);
  CHECK(r.err.find("layer 0 (full_attention): output hidden state is NaN/Inf") !=
        std::string::npos);
  CHECK_FALSE(testing::exists(dir.path() / "p.yaml"));
}
