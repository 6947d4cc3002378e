// --samples auto (issue 59, src/calib/job/auto_samples.hpp): the sequential rule, its refusals, and
// that an auto run's policy is the fixed run's at the sequences it chose, in the CLI and in regen.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../support/cli_calibrate.hpp"
#include "../support/temp_dir.hpp"
#include "../support/test_paths.hpp"
#include "calib/job/auto_samples.hpp"
#include "headwise/calib/calibration_file.hpp"
#include "headwise/core/files.hpp"
#include "headwise/tasks/synthetic.hpp"

using namespace headwise;
using testing::calibrate;
using testing::run_cli;
using testing::TempDir;
namespace fs = std::filesystem;

namespace {

// A walked layer's noise as the rule reads it: separated or not, and the sequences it needs (NaN:
// the gap is not positive).
calib::DecisionNoise noise(int64_t layer, bool separated, double need) {
  calib::DecisionNoise n;
  n.layer_id = layer;
  n.separated = separated;
  n.sequences_to_separate = need;
  return n;
}

// The gemma3_gqa4 fixture (not in policies/manifest.yaml) at 256 tokens, ladder 8,32,full. At a
// 66k budget under seed 6 its global layer's decision is not separated at 8 sequences and needs 17
// (so the rule's next round is 24), and 145 at 24; at 62k under seed 0 every decision is separated
// at 8.
const std::string kModel = std::string(HEADWISE_FIXTURES_DIR) + "/gemma3_gqa4";

std::string gemma(const std::string& budget, int seed) {
  return "--model " + kModel + " --context 256 --windows 8,32,full --budget " + budget +
         " --seed " + std::to_string(seed) + " -q";
}

// The policy's text without the lines an auto run adds or changes (inputs_sha256, samples_auto).
std::string without_auto_lines(const std::string& yaml) {
  std::istringstream in(yaml);
  std::string line, out;
  bool in_auto = false;
  while (std::getline(in, line)) {
    if (line.find("samples_auto:") != std::string::npos) {
      in_auto = true;
      continue;
    }
    if (in_auto && line.rfind("    ", 0) == 0) continue;  // the block's own keys
    in_auto = false;
    if (line.find("inputs_sha256") == std::string::npos) out += line + "\n";
  }
  return out;
}

// policy.calibration's samples key and samples_auto block, as written.
std::string auto_record(const std::string& yaml) {
  std::istringstream in(yaml);
  std::string line, out;
  while (std::getline(in, line)) {
    const std::string key = line.substr(std::min(line.find_first_not_of(' '), line.size()));
    for (const char* wanted : {"samples:", "samples_auto:", "cap:", "rounds:"}) {
      if (key.rfind(wanted, 0) == 0) out += line + "\n";
    }
  }
  return out;
}

}  // namespace

TEST_CASE("samples auto: the next round's sequences", "[calib]") {
  using calib::next_samples;
  // Every decision separated: stop.
  CHECK_FALSE(next_samples({noise(1, true, 8), noise(3, true, 8)}, 8, 32));
  // Not separated within the cap: the larger of twice the sequences and the need (to 8s).
  CHECK(next_samples({noise(1, true, 8), noise(3, false, 12)}, 8, 32) == 16);
  CHECK(next_samples({noise(1, false, 17), noise(3, false, 30)}, 8, 32) == 32);
  CHECK(next_samples({noise(1, false, 17)}, 8, 32) == 24);
  CHECK(next_samples({noise(1, false, 20)}, 16, 32) == 32);
  // A cap that is not a multiple of 8 bounds the round.
  CHECK(next_samples({noise(1, false, 17)}, 8, 20) == 20);
  // Beyond the cap, or a gap that is not positive (no finite need): nothing more buys it.
  CHECK_FALSE(next_samples({noise(1, false, 86), noise(3, true, 8)}, 8, 32));
  CHECK_FALSE(next_samples({noise(1, false, std::nan(""))}, 8, 32));
  // One layer within the cap is enough; the cap reached stops.
  CHECK(next_samples({noise(1, false, 255), noise(3, false, 30)}, 8, 32) == 32);
  CHECK_FALSE(next_samples({noise(3, false, 30)}, 32, 32));
  // No noise at all (a measure without per-sequence values): nothing to read, stop.
  CHECK_FALSE(next_samples({}, 8, 32));
  CHECK(calib::unseparated_summary({noise(1, true, 8), noise(3, false, 85.2)}) ==
        "layer 3 needs 86");
}

// A round of the rule must add sequences to the ones before, not draw others: the built-in set
// draws them one after another from the seed, a file is packed in its records' order.
TEST_CASE("samples auto: fewer sequences are the first of more, built-in or from a file",
          "[calib]") {
  const tasks::SyntheticOptions eight{128, 8, 256, 6};
  tasks::SyntheticOptions twenty_four = eight;
  twenty_four.samples = 24;
  const auto few = tasks::synthetic_retrieval_set(eight);
  const auto more = tasks::synthetic_retrieval_set(twenty_four);
  REQUIRE(more.size() == 24);
  CHECK(std::equal(few.begin(), few.end(), more.begin()));
  CHECK(few != std::vector<std::vector<int64_t>>(more.begin() + 8, more.begin() + 16));

  // Records longer than a sequence are cut to one, shorter ones packed together: the order holds.
  TempDir dir("samples-auto");
  std::string jsonl;
  for (int r = 0; r < 12; ++r) {
    std::string ids;
    for (int t = 0; t < (r % 3 == 0 ? 40 : 7 + r); ++t) {
      if (t > 0) ids += ',';
      ids += std::to_string(16 + (r * 7 + t) % 100);
    }
    jsonl += "{\"input_ids\": [" + ids + "]}\n";
  }
  const fs::path file = dir.write("data.jsonl", jsonl);
  const auto three = calib::load_calibration_set(file, nullptr, 16, 3, 128).sequences;
  const auto six = calib::load_calibration_set(file, nullptr, 16, 6, 128).sequences;
  REQUIRE(six.size() == 6);
  CHECK(std::equal(three.begin(), three.end(), six.begin()));
}

TEST_CASE("samples auto refuses bad input with one line and writes nothing", "[cli]") {
  TempDir dir("samples-auto");
  const auto out = (dir / "p.yaml").string();
  const std::string base = gemma("66k", 6) + " -o " + out;
  // Three records, each cut to one sequence: fewer than --samples 8, and than auto's cap.
  std::string ids;
  for (int t = 0; t < 4096; ++t) {
    if (t > 0) ids += ',';
    ids += std::to_string(16 + t % 100);
  }
  std::string records;
  for (int r = 0; r < 3; ++r) records += "{\"input_ids\": [" + ids + "]}\n";
  const std::string short_file = dir.write("short.jsonl", records).string();
  const std::vector<testing::Refusal> cases{
      {base + " --samples auto --calib " + short_file,
       "gives 3 sequence(s) of 256 tokens, 32 asked for (--samples-cap); use a shorter sequence "
       "length, a smaller --samples-cap or more data"},
      {base + " --samples 8 --calib " + short_file, "8 asked for (--samples); use"},
      {base + " --samples 8 --samples-cap 16", "--samples-cap bounds --samples auto only"},
      {base + " --samples-cap 16", "--samples-cap bounds --samples auto only"},
      {base + " --samples auto --samples-cap 4", "--samples-cap must be at least 8"},
      {base + " --samples auto --samples-cap 0", "--samples-cap must be at least 8"},
      {base + " --samples auto --samples-cap many", "--samples-cap"},
      {base + " --samples many", "--samples"},
      {base + " --samples 0", "--samples must be positive"},
      {base + " --memory-limit 0", "--memory-limit: '0' must be positive"},
      {base + " --memory-limit lots", "--memory-limit"},
      {base + " --samples auto --distortion answer-tv", "--samples auto reads the decision noise"},
      {base + " --samples auto --resume", "--resume: not with --samples auto"},
  };
  testing::check_refusals(cases, out);
}

TEST_CASE("samples auto draws more where a decision needs it and gives the fixed run's policy",
          "[cli]") {
  TempDir dir("samples-auto");
  const std::string args = gemma("66k", 6);
  const std::string automatic = calibrate(dir, "auto", args + " --samples auto");
  CHECK(auto_record(automatic) ==
        "  samples: 24\n  samples_auto:\n    cap: 32\n    rounds: [8, 24]\n");
  const std::string fixed = calibrate(dir, "fixed", args + " --samples 24");
  CHECK(without_auto_lines(automatic) == without_auto_lines(fixed));
  CHECK(automatic != fixed);  // the inputs (auto, its cap) are hashed, and recorded
  // The cap bounds the rounds: at 20 the second round is the cap; at 16 the need of 17 is beyond
  // it, and the rule keeps the first round.
  const std::string capped = calibrate(dir, "capped", args + " --samples auto --samples-cap 20");
  CHECK(auto_record(capped) ==
        "  samples: 20\n  samples_auto:\n    cap: 20\n    rounds: [8, 20]\n");
  const std::string beyond = calibrate(dir, "beyond", args + " --samples auto --samples-cap 16");
  CHECK(auto_record(beyond) == "  samples: 8\n  samples_auto:\n    cap: 16\n    rounds: [8]\n");
}

TEST_CASE("samples auto stays at 8 sequences when the first round separates every decision",
          "[cli]") {
  TempDir dir("samples-auto");
  const std::string args = gemma("62k", 0);
  const fs::path report = dir / "auto.json";
  const std::string automatic =
      calibrate(dir, "auto", args + " --samples auto --report " + report.string());
  const auto layers = nlohmann::json::parse(read_text_file(report))["decision_noise"]["layers"];
  REQUIRE(!layers.empty());
  for (const auto& layer : layers) CHECK(layer["separated"] == true);
  CHECK(auto_record(automatic) == "  samples: 8\n  samples_auto:\n    cap: 32\n    rounds: [8]\n");
  CHECK(without_auto_lines(automatic) ==
        without_auto_lines(calibrate(dir, "fixed", args + " --samples 8")));
}

TEST_CASE("regen replays a --samples auto entry and checks it", "[cli]") {
  TempDir dir("samples-auto");
  const fs::path manifest = dir.write(
      "manifest.yaml", "policies:\n  - name: auto\n    model: " + kModel +
                           "\n    context: 256\n    budget: 66k\n    windows: [8, 32, full]\n"
                           "    samples: auto\n    samples_cap: 32\n    seed: 6\n"
                           "    output: auto.yaml\n");
  const auto written = run_cli("regen --manifest " + manifest.string() + " --quiet");
  INFO(written.err);
  REQUIRE(written.status == 0);
  const std::string regenerated = read_text_file(dir / "auto.yaml");
  CHECK(auto_record(regenerated) ==
        "  samples: 24\n  samples_auto:\n    cap: 32\n    rounds: [8, 24]\n");
  // The main command's run of the same options writes the same policy, hash included (from a
  // folder as deep, so model_path reads the same).
  TempDir elsewhere("samples-auto");
  CHECK(calibrate(elsewhere, "cli", gemma("66k", 6) + " --samples auto --samples-cap 32") ==
        regenerated);
  // The inputs hash covers auto and its cap, not the rounds' outcome: a second regen skips it.
  const auto again = run_cli("regen --manifest " + manifest.string());
  CHECK(again.status == 0);
  CHECK_THAT(again.out, Catch::Contains("skipped: inputs unchanged"));
  const auto check = run_cli("regen --manifest " + manifest.string() + " --check --all --quiet");
  INFO(check.err);
  CHECK(check.status == 0);
}

// The rule's largest round is planned before its first: under a --memory-limit that the first
// round's 8 sequences fit and the cap's 32 do not, the auto run is refused at once, although this
// configuration's rule would keep 8 (above). The refusal names the cap and the limit.
TEST_CASE("samples auto plans the cap's memory before its first round", "[cli]") {
  TempDir dir("samples-auto");
  const std::string args = gemma("62k", 0);
  const fs::path report = dir / "fixed.json";
  calibrate(dir, "fixed", args + " --samples 8 --report " + report.string());
  const auto plan = nlohmann::json::parse(read_text_file(report))["memory"]["plan"];
  const auto eight = plan["planned_peak_bytes"].get<int64_t>();
  const std::string limit = " --memory-limit " + std::to_string(eight);
  calibrate(dir, "limited", args + " --samples 8" + limit);  // the first round's plan fits
  const fs::path out = dir / "auto.yaml";
  const auto run = run_cli(args + " --samples auto" + limit + " -o " + out.string());
  INFO(run.err);
  CHECK(run.status == 3);  // infeasible, as a budget below the minimum
  CHECK_THAT(run.err, Catch::Contains("is available (--memory-limit); lower --samples-cap,"));
  CHECK(std::count(run.err.begin(), run.err.end(), '\n') == 1);
  CHECK(!fs::exists(out));
}
