// Jamba: parity with transformers on a tiny random checkpoint (tools/fixtures/jamba.py: Mamba-1
// layers with dt/B/C norms, attention without RoPE at layers 1 and 3, MoE on layers 0 and 2), and
// that the scan's pieces matter.
#include <catch2/catch.hpp>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"

using namespace headwise;
using namespace headwise::testing;

TEST_CASE("jamba matches transformers in fp32 and bf16", "[parity]") {
  check_parity_fp32_bf16("jamba_tiny");
}

TEST_CASE("jamba's D skip and routing are in force", "[parity]") {
  const auto no_skip = edited_fixture_error("jamba_tiny", same_config, zero_tensors("mamba.D"));
  CHECK(no_skip.error > 1e-3 * no_skip.scale);
  const auto top1 = edited_fixture_error("jamba_tiny", [](nlohmann::json c) {
    c["num_experts_per_tok"] = 1;
    return c;
  });
  CHECK(top1.error > 1e-3 * top1.scale);
  CHECK(arch::load_model_spec(fixture_dir("jamba_tiny")).global_layer_ids() ==
        std::vector<int64_t>{1, 3});
}
