// eval --write-samples: the samples another runtime answers for tools/peers_eval.py are exactly
// the ones eval answers (make_eval_samples with eval's request), nothing is evaluated, and a path
// that cannot be written fails with one line and leaves nothing behind.
#include <catch2/catch.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "../arch/fixture_reference.hpp"
#include "../support/temp_dir.hpp"
#include "eval_helpers.hpp"
#include "headwise/eval/tasks.hpp"

using namespace headwise;
namespace fs = std::filesystem;

TEST_CASE("eval --write-samples writes eval's own samples, one JSON line each, and stops",
          "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  std::mt19937_64 rng(7);
  const auto spec = arch::load_model_spec(dir);
  const auto p = headwise::testing::fixture_policy(
      dir, headwise::testing::random_policy_windows(spec, {8, 32, policy::kFull}, rng));
  const fs::path policy_path = tmp.path() / "policy.yaml";
  policy::write_policy(policy_path, p);
  const fs::path out = tmp.path() / "samples.jsonl";
  const auto r = headwise::testing::run_cli("eval --model " + dir.string() + " --policy " +
                                                policy_path.string() +
                                                " --samples 3 --seed 11 --seq-len 200 --tasks "
                                                "needle_single,needle_chain --write-samples " +
                                                out.string() + " --quiet",
                                            tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.empty());  // nothing evaluated, no table

  const auto want = eval::make_eval_samples(
      dir, spec.vocab_size, eval::TaskRequest{{"needle_single", "needle_chain"}, 3, 200, 11});
  std::istringstream lines(read_text_file(out));
  std::vector<nlohmann::json> got;
  for (std::string line; std::getline(lines, line);) got.push_back(nlohmann::json::parse(line));
  REQUIRE(got.size() == want.size());
  REQUIRE(want.size() == 6);
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("sample " << i);
    CHECK(got[i].at("task") == want[i].task);
    CHECK(got[i].at("prompt").get<std::vector<int64_t>>() == want[i].prompt);
    CHECK(got[i].at("answer").get<std::vector<int64_t>>() == want[i].answer);
    CHECK(got[i].at("answer_source").get<std::vector<int64_t>>() == want[i].answer_source);
  }
  // The chain's later queries copy the model's own earlier answer tokens: sources are there.
  CHECK(std::any_of(got.begin(), got.end(), [](const nlohmann::json& s) {
    return s.at("task") == "needle_chain" && !s.at("answer_source").empty();
  }));

  const fs::path unwritable = tmp.path() / "no-such-dir" / "samples.jsonl";
  const auto bad = headwise::testing::run_cli(
      "eval --model " + dir.string() + " --policy " + policy_path.string() +
          " --samples 1 --seq-len 200 --write-samples " + unwritable.string(),
      tmp.path());
  CHECK(bad.status == 1);
  CHECK(bad.err.find("no-such-dir") != std::string::npos);
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  CHECK_FALSE(fs::exists(unwritable));
}
