// Nemotron-H: parity with transformers on a tiny random checkpoint (tools/fixtures/nemotron_h.py:
// M, *, - blocks; grouped gated norm; dt clamped at time_step_min; Hub "backbone." names), and
// MoE blocks refused for the forward while their config still estimates memory.
#include <catch2/catch.hpp>

#include <functional>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"

using namespace headwise;
using namespace headwise::testing;

TEST_CASE("nemotron_h matches transformers in fp32 and bf16", "[parity]") {
  check_parity_fp32_bf16("nemotron_h_tiny");
}

TEST_CASE("nemotron_h's time-step floor is in force; MoE blocks are refused", "[parity]") {
  const auto fixture = fixture_dir("nemotron_h_tiny");
  const at::Tensor reference = read_reference(fixture, "logits_fp32");
  const auto differs = [&](const std::function<nlohmann::json(nlohmann::json)>& edit) {
    TempDir dir;
    copy_fixture(fixture, dir.path(), edit);
    const auto err = compare(run_fixture(fixture, {}, dir.path()), reference);
    return err.error > 1e-3 * err.scale;
  };
  CHECK(differs([](nlohmann::json c) {
    c["time_step_min"] = 2.0;  // above the fixture's time steps: the clamp binds
    return c;
  }));
  TempDir dir;
  copy_fixture(fixture, dir.path(), [](nlohmann::json c) {
    c["layers_block_type"][2] = "moe";
    return c;
  });
  CHECK(arch::load_model_spec(dir.path()).num_layers() == 6);  // memory estimates still read it
  CHECK_THROWS_WITH(arch::load_model(dir.path(), {}), Catch::Contains("block 2 is a MoE block"));
}
