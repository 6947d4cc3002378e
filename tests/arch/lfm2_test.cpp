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
  const auto fixture = fixture_dir("lfm2_tiny");
  TempDir dir;
  copy_fixture(
      fixture, dir.path(), [](nlohmann::json c) { return c; },
      [](EditableTensor& t) {
        if (t.name.find("conv.conv.bias") != std::string::npos)
          std::fill(t.data.begin(), t.data.end(), std::byte{0});
        return true;
      });
  const auto err =
      compare(run_fixture(fixture, {}, dir.path()), read_reference(fixture, "logits_fp32"));
  CHECK(err.error > 1e-3 * err.scale);
  CHECK(arch::load_model_spec(fixture).global_layer_ids() == std::vector<int64_t>{1, 3});
}
