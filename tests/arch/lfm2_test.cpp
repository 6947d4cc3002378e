// LFM2: parity with transformers on a tiny random checkpoint (tools/fixtures/lfm2.py: gated short
// convolutions with biases, attention with q/k norms, SwiGLU), and that the convolutions matter.
#include <catch2/catch.hpp>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"

using namespace headwise;
using namespace headwise::testing;

TEST_CASE("lfm2 matches transformers in fp32 and bf16", "[parity]") {
  const auto fixture = fixture_dir("lfm2_tiny");
  const auto fp32 = compare(run_fixture(fixture, {}), read_reference(fixture, "logits_fp32"));
  INFO("fp32 max abs err " << fp32.error << ", logit scale " << fp32.scale);
  CHECK(fp32.error <= 1e-4 * fp32.scale);
  arch::ModelOptions options;
  options.compute_dtype = DType::kBFloat16;
  const auto bf16 = compare(run_fixture(fixture, options), read_reference(fixture, "logits_bf16"));
  INFO("bf16 max abs err " << bf16.error << ", logit scale " << bf16.scale);
  CHECK(bf16.error <= 4e-3 * bf16.scale);  // one bf16 ulp of the logit scale, as for the other families
}

TEST_CASE("lfm2's convolution biases are applied (dropping them changes the logits)", "[parity]") {
  const auto fixture = fixture_dir("lfm2_tiny");
  TempDir dir;
  copy_fixture(fixture, dir.path(), [](nlohmann::json c) { return c; }, [](EditableTensor& t) {
    if (t.name.find("conv.conv.bias") != std::string::npos) std::fill(t.data.begin(), t.data.end(), std::byte{0});
    return true;
  });
  const auto err = compare(run_fixture(fixture, {}, dir.path()), read_reference(fixture, "logits_fp32"));
  CHECK(err.error > 1e-3 * err.scale);
  CHECK(arch::load_model_spec(fixture).global_layer_ids() == std::vector<int64_t>{1, 3});
}
