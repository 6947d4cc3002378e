// --needles (issue 59): the built-in calibration set's needles per sequence, explicit or auto, and
// its refusals. The data's description and sha256 carry it into the policy and its hash.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "../support/cli_calibrate.hpp"
#include "../support/temp_dir.hpp"
#include "../support/test_paths.hpp"

using namespace headwise;
using testing::calibrate;
using testing::run_cli;
using testing::TempDir;
namespace fs = std::filesystem;

namespace {

// The gemma3_gqa4 fixture (not in policies/manifest.yaml) at 256 tokens: the set's own default is
// one needle per 512 tokens, at least 1.
const std::string kModel = std::string(HEADWISE_FIXTURES_DIR) + "/gemma3_gqa4";
const std::string kArgs =
    "--model " + kModel + " --context 256 --windows 8,32,full --budget 62k --seed 0 -q";

// The value of the first line holding `key` (its text after the key), or "" without one.
std::string line_value(const std::string& yaml, const std::string& key) {
  std::istringstream in(yaml);
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find(key);
    if (at != std::string::npos) return line.substr(at + key.size());
  }
  return "";
}

}  // namespace

TEST_CASE("--needles sets the built-in set's needles, and the auto value keeps the policy",
          "[cli]") {
  TempDir dir("needles");
  const std::string plain = calibrate(dir, "plain", kArgs);
  const std::string one = calibrate(dir, "one", kArgs + " --needles 1");
  const std::string three = calibrate(dir, "three", kArgs + " --needles 3");
  CHECK_THAT(line_value(plain, "dataset:"), Catch::Contains("needles=1,"));
  // The same data as auto: the same policy, its hash included.
  CHECK(one == plain);
  CHECK_THAT(line_value(three, "dataset:"), Catch::Contains("needles=3,"));
  CHECK(line_value(three, "dataset_sha256:") != line_value(plain, "dataset_sha256:"));
  CHECK(line_value(three, "inputs_sha256:") != line_value(plain, "inputs_sha256:"));
}

TEST_CASE("--needles is refused where the set cannot take it, in one line", "[cli]") {
  TempDir dir("needles-refused");
  const fs::path out = dir / "p.yaml";
  const std::string base = kArgs + " -o " + out.string();
  std::string ids;
  for (int t = 0; t < 4096; ++t) {
    if (t > 0) ids += ',';
    ids += std::to_string(16 + t % 100);
  }
  const std::string file = dir.write("data.jsonl", "{\"input_ids\": [" + ids + "]}\n").string();
  const std::vector<testing::Refusal> cases{
      {base + " --needles 0", "--needles must be positive, got 0"},
      {base + " --needles -2", "--needles must be positive, got -2"},
      {base + " --needles many", "--needles"},
      // 10 needles of 7 tokens need a haystack three times their queries: 280 tokens.
      {base + " --needles 10",
       "--needles 10 do not fit calibration sequences of 256 tokens (they need at least 280: "
       "lower --needles or raise --seq-len)"},
      {base + " --needles 2 --samples 1 --calib " + file,
       "--needles 2 applies to the built-in calibration set, not to --calib "},
  };
  testing::check_refusals(cases, out);
}
