// LFM2: parity with transformers on a tiny random checkpoint (tools/fixtures/lfm2.py: gated short
// convolutions with biases, attention with q/k norms, SwiGLU), and that the convolutions matter.
#include <catch2/catch.hpp>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"

using namespace headwise;
using namespace headwise::testing;

TEST_CASE("lfm2 matches transformers in fp32 and bf16", "[parity]") {
  check_parity_fp32_bf16("lfm2_tiny");
}

TEST_CASE("lfm2's convolution biases are applied (dropping them changes the logits)", "[parity]") {
  const auto err = edited_fixture_error("lfm2_tiny", same_config, zero_tensors("conv.conv.bias"));
  CHECK(err.error > 1e-3 * err.scale);
  CHECK(arch::load_model_spec(fixture_dir("lfm2_tiny")).global_layer_ids() ==
        std::vector<int64_t>{1, 3});
}
