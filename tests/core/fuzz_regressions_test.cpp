// One regression test per fuzzing finding (tools/fuzz.sh; docs/hardening.md).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "../arch/fixture_reference.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/io/safetensors.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;

// fuzz_safetensors_header: a number beyond double range in the header made nlohmann throw
// out_of_range (not parse_error), which escaped as an internal error (exit 5).
TEST_CASE("fuzz: safetensors header with a number out of double range is an InputError", "[io]") {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,42e8544]}})";
  CHECK_THROWS_MATCHES(io::parse_safetensors_header(header, 4, "m.safetensors"), InputError,
                       Catch::Matchers::Contains("m.safetensors: safetensors header is not valid JSON"));
}

// The same nlohmann behaviour in read_json_file (config.json, reports, checkpoints).
TEST_CASE("fuzz: a JSON file with a number out of double range is an InputError naming it", "[io]") {
  testing::TempDir dir;
  write_file_atomically(dir.path() / "config.json", R"({"hidden_size": 1e999})");
  CHECK_THROWS_MATCHES(read_json_file(dir.path() / "config.json"), InputError,
                       Catch::Matchers::Contains("config.json: malformed JSON"));
}
