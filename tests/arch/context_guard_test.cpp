// Context guards: a context beyond the config's max_position_embeddings is a warning naming the
// field and the RoPE scaling (and the policy records it); one the rotary angles cannot represent
// is an error naming the flag.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "../arch/fixture_reference.hpp"
#include "../test_configs.hpp"
#include "headwise/arch/context_guard.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"

using namespace headwise;

TEST_CASE("context guard: within, beyond the trained positions, beyond what RoPE can represent",
          "[arch]") {
  const auto dir =
      headwise::testing::fixture_dir("llama_rope3");  // max_position_embeddings 256, llama3 RoPE
  const auto spec = arch::load_model_spec(dir);
  const auto limit = arch::context_limit(spec);
  CHECK(limit.max_position_embeddings == 256);
  CHECK(limit.rope.find("llama3") == 0);
  CHECK(limit.rope.find("(from 32)") != std::string::npos);

  CHECK_FALSE(arch::check_context(spec, 256, "--context", "cfg.json").has_value());
  const auto warning = arch::check_context(spec, 257, "--context", "cfg.json");
  REQUIRE(warning.has_value());
  CHECK(warning->find("--context 257") != std::string::npos);
  CHECK(warning->find("cfg.json max_position_embeddings 256") != std::string::npos);
  CHECK(warning->find("llama3") != std::string::npos);

  for (int64_t bad : {int64_t{0}, arch::kMaxRepresentablePosition + 1}) {
    INFO(bad);
    try {
      (void)arch::check_context(spec, bad, "--context", "cfg.json");
      FAIL("accepted");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("--context") != std::string::npos);
    }
  }
  CHECK(arch::check_context(spec, arch::kMaxRepresentablePosition, "--context", "cfg.json")
            .has_value());

  // A config that states no max_position_embeddings (this Gemma-3 one) is never warned about;
  // its legacy rope_scaling is still described.
  const auto gemma_spec = headwise::testing::spec_from_config("gemma3_27b.json");
  const auto gemma = arch::context_limit(gemma_spec);
  CHECK(gemma.max_position_embeddings == 0);
  CHECK(gemma.rope == "linear x8");
  CHECK_FALSE(arch::check_context(gemma_spec, 1 << 20, "--context", "cfg.json").has_value());
}
