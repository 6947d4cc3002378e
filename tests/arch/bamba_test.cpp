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
  const auto fixture = fixture_dir("bamba_tiny");
  const at::Tensor reference = read_reference(fixture, "logits_fp32");
  {
    TempDir dir;  // one chunk of 128 instead of three of 40: the same sequence model
    copy_fixture(fixture, dir.path(), [](nlohmann::json c) {
      c["mamba_chunk_size"] = 128;
      return c;
    });
    const auto err = compare(run_fixture(fixture, {}, dir.path()), reference);
    CHECK(err.error <= 1e-4 * err.scale);
  }
  {
    TempDir dir;
    copy_fixture(
        fixture, dir.path(), [](nlohmann::json c) { return c; },
        [](EditableTensor& t) {
          if (t.name.find("mamba.D") != std::string::npos)
            std::fill(t.data.begin(), t.data.end(), std::byte{0});
          return true;
        });
    const auto err = compare(run_fixture(fixture, {}, dir.path()), reference);
    CHECK(err.error > 1e-3 * err.scale);
  }
  CHECK(arch::load_model_spec(fixture).global_layer_ids() == std::vector<int64_t>{1, 3});
}
