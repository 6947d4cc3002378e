// Falcon-H1: parity with transformers on tiny random checkpoints (tools/fixtures/falcon_h1.py:
// parallel Mamba-2 + RoPE attention in every layer, every muP multiplier away from 1; with the
// grouped gated norm with the gate before or after it, and with the gate alone), and that the
// multipliers act.
#include <catch2/catch.hpp>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"

using namespace headwise;
using namespace headwise::testing;

TEST_CASE("falcon_h1 matches transformers in fp32 and bf16", "[parity]") {
  check_parity_fp32_bf16("falcon_h1_tiny");
  check_parity_fp32_bf16("falcon_h1_gate_after");
  check_parity_fp32_bf16("falcon_h1_nonorm");
}

TEST_CASE("falcon_h1's multipliers are in force; every layer is global", "[parity]") {
  for (const char* field :
       {"key_multiplier", "ssm_in_multiplier", "attention_out_multiplier", "lm_head_multiplier"}) {
    const auto err = edited_fixture_error("falcon_h1_tiny", [field](nlohmann::json c) {
      c[field] = 1.0;
      return c;
    });
    INFO(field);
    CHECK(err.error > 1e-5 * err.scale);
  }
  const auto mup = edited_fixture_error("falcon_h1_tiny", [](nlohmann::json c) {
    c["ssm_multipliers"] = {1.0, 1.0, 1.0, 1.0, 1.0};
    return c;
  });
  CHECK(mup.error > 1e-5 * mup.scale);
  CHECK(arch::load_model_spec(fixture_dir("falcon_h1_tiny")).global_layer_ids() ==
        std::vector<int64_t>{0, 1, 2});
}
