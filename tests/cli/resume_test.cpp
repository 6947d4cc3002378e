// Resumable calibration end to end: a run killed after a global layer's checkpoint (SIGKILL from
// a hook the test preloads, support/kill_after_checkpoint.c) leaves its checkpoint and no policy;
// --resume finishes it byte-identically to an uninterrupted run and deletes the checkpoint;
// a checkpoint from other inputs is refused with a clear error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "cli_helpers.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/memory/memory_model.hpp"

using namespace headwise;
using headwise::testing::CliRun;
using headwise::testing::run_cli_with;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture =
    fs::path(HEADWISE_FIXTURES_DIR) / "qwen3_gqa";  // 4 global layers, 2 KV heads each

// A budget between the smallest and the full ladder, so every layer has a real choice.
std::string middle_budget() {
  const arch::ModelSpec spec = arch::load_model_spec(kFixture);
  memory::MemoryOptions mem;
  mem.context = 4096;
  mem.kv_dtype = spec.dtype;
  int64_t budget = memory::fixed_bytes(spec, mem);
  for (int64_t id : spec.global_layer_ids()) {
    const auto& att = *spec.layer(id).attention;
    budget += att.num_kv_heads * memory::head_bytes(att, 64, mem);
  }
  return std::to_string(budget);
}

std::string calibrate_args(const fs::path& output, const std::string& seed = "3") {
  return "--model " + kFixture.string() + " --context 4k --budget " + middle_budget() +
         " --windows 16,64,256,full --seq-len 320 --samples 2 --seed " + seed + " -o " +
         output.string() + " --quiet";
}

// The environment that kills the child right after its n-th checkpoint write.
std::string kill_after_checkpoints(int n) {
  return std::string("LD_PRELOAD=") + HEADWISE_KILL_HOOK +
         " HEADWISE_KILL_AFTER_CHECKPOINTS=" + std::to_string(n);
}

}  // namespace

TEST_CASE("calibrate --resume after a kill gives a byte-identical policy", "[cli]") {
  testing::TempDir dir;
  const fs::path whole = dir.path() / "whole.yaml", resumed = dir.path() / "resumed.yaml";
  const fs::path checkpoint = dir.path() / "resumed.yaml.ckpt.json";

  const CliRun uninterrupted = run_cli_with(calibrate_args(whole));
  INFO(uninterrupted.err);
  REQUIRE(uninterrupted.status == 0);
  CHECK_FALSE(testing::exists(dir.path() / "whole.yaml.ckpt.json"));  // deleted on success

  // Kill after global layer 1 (the second checkpoint), resume and kill after layer 2 (the
  // resumed run's first), then resume to the end.
  for (const auto& [layer, checkpoints] : {std::pair{1, 2}, std::pair{2, 1}}) {
    const CliRun killed = run_cli_with(calibrate_args(resumed) + (layer == 2 ? " --resume" : ""),
                                       kill_after_checkpoints(checkpoints));
    INFO(killed.err);
    REQUIRE(killed.status == -SIGKILL);
    CHECK_FALSE(testing::exists(resumed));
    REQUIRE(testing::exists(checkpoint));
    CHECK(read_json_file(checkpoint)["state"]["last_layer"] == layer);
  }
  const CliRun finished = run_cli_with(calibrate_args(resumed) + " --resume");
  INFO(finished.err);
  REQUIRE(finished.status == 0);
  CHECK(read_text_file(resumed) == read_text_file(whole));
  CHECK_FALSE(testing::exists(checkpoint));
}

TEST_CASE("calibrate --resume refuses a checkpoint written for other inputs", "[cli]") {
  testing::TempDir dir;
  const fs::path output = dir.path() / "p.yaml";
  const CliRun killed = run_cli_with(calibrate_args(output, "3"), kill_after_checkpoints(1));
  REQUIRE(killed.status == -SIGKILL);
  const CliRun other = run_cli_with(calibrate_args(output, "4") + " --resume");
  CHECK(other.status == 1);
  CHECK(other.err.find("p.yaml.ckpt.json") != std::string::npos);
  CHECK(other.err.find("different inputs") != std::string::npos);
  CHECK(std::count(other.err.begin(), other.err.end(), '\n') == 1);
  CHECK_FALSE(testing::exists(output));
  // Without --resume the stale checkpoint is replaced and the run completes.
  const CliRun fresh = run_cli_with(calibrate_args(output, "4"));
  CHECK(fresh.status == 0);
  CHECK(testing::exists(output));
  CHECK_FALSE(testing::exists(dir.path() / "p.yaml.ckpt.json"));
}
