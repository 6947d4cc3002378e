// Bamba (Mamba-2 hybrid): parity with transformers on a tiny random checkpoint
// (tools/fixtures/bamba.py: the chunked SSD scan over 96 tokens in chunks of 40, the last padded;
// 6 heads in 3 groups; partial-RoPE attention at layers 1 and 3), and that the scan's pieces
// matter.
#include <catch2/catch.hpp>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"

using namespace headwise;
using namespace headwise::testing;

TEST_CASE("bamba matches transformers in fp32 and bf16", "[parity]") {
  check_parity_fp32_bf16("bamba_tiny");
}

TEST_CASE("bamba's chunk size does not change the scan; its D skip does", "[parity]") {
  // One chunk of 128 instead of three of 40: the same sequence model.
  const auto chunked = edited_fixture_error("bamba_tiny", [](nlohmann::json c) {
    c["mamba_chunk_size"] = 128;
    return c;
  });
  CHECK(chunked.error <= 1e-4 * chunked.scale);
  const auto no_skip = edited_fixture_error("bamba_tiny", same_config, zero_tensors("mamba.D"));
  CHECK(no_skip.error > 1e-3 * no_skip.scale);
  CHECK(arch::load_model_spec(fixture_dir("bamba_tiny")).global_layer_ids() ==
        std::vector<int64_t>{1, 3});
}
