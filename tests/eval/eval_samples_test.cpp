// eval --write-samples: the samples another runtime answers for tools/peers_eval.py are exactly
// the ones eval answers (make_eval_samples with eval's request), nothing is evaluated, and a path
// that cannot be written fails with one line and leaves nothing behind.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "../arch/fixture_reference.hpp"
#include "../support/temp_dir.hpp"
#include "eval_helpers.hpp"
#include "headwise/eval/evaluation.hpp"
#include "headwise/eval/tasks.hpp"

using namespace headwise;
namespace fs = std::filesystem;

namespace {

// A policy of random windows for the fixture in `dir`, written into `folder`: what both eval runs
// below answer with.
fs::path write_random_policy(const fs::path& dir, const fs::path& folder) {
  std::mt19937_64 rng(7);
  const auto spec = arch::load_model_spec(dir);
  const auto p = headwise::testing::fixture_policy(
      dir, headwise::testing::random_policy_windows(spec, {8, 32, policy::kFull}, rng));
  const fs::path path = folder / "policy.yaml";
  policy::write_policy(path, p);
  return path;
}

}  // namespace

TEST_CASE("eval --write-samples writes eval's own samples, one JSON line each, and stops",
          "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  const fs::path policy_path = write_random_policy(dir, tmp.path());
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

namespace {

std::vector<nlohmann::json> json_lines(const fs::path& path) {
  std::istringstream lines(read_text_file(path));
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

// eval --write-tokens: what every method that ran decoded on every sample, keyed so another
// runtime's answers to the --write-samples file can be compared token by token
// (tests/python/test_snap_serving.py does); the counts are the document's own.
TEST_CASE("eval --write-tokens writes each method's decoded tokens per sample, atomically",
          "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const fs::path policy_path = write_random_policy(dir, tmp.path());
  const std::string common = "eval --model " + dir.string() + " --policy " + policy_path.string() +
                             " --samples 2 --seed 11 --seq-len 200 --tasks "
                             "needle_single,needle_chain --baselines full,streamingllm --quiet";
  const fs::path samples_path = tmp.path() / "samples.jsonl";
  REQUIRE(
      headwise::testing::run_cli(common + " --write-samples " + samples_path.string(), tmp.path())
          .status == 0);
  const fs::path tokens_path = tmp.path() / "tokens.jsonl";
  const auto r = headwise::testing::run_cli(
      common + " --json --write-tokens " + tokens_path.string(), tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const nlohmann::json document = nlohmann::json::parse(r.out);
  const auto samples = json_lines(samples_path);
  const auto tokens = json_lines(tokens_path);
  const nlohmann::json& methods = document.at("methods");
  REQUIRE(samples.size() == 4);
  REQUIRE(methods.size() == 3);
  REQUIRE(tokens.size() == methods.size() * samples.size());

  // The prompt's name is the documented recipe: SHA-256 of its ids joined by commas.
  CHECK(eval::prompt_sha256({12, 7, 301}) ==
        "cbef4c90eae13eaf882ba3c80b1020a1a86d3ae70484d9490b50bc94ddcfe2d2");
  for (size_t m = 0; m < methods.size(); ++m) {
    std::map<std::string, int64_t> right, seen;
    for (size_t n = 0; n < samples.size(); ++n) {
      const nlohmann::json& t = tokens[m * samples.size() + n];
      const nlohmann::json& s = samples[n];
      INFO("method " << m << " sample " << n << ": " << t.dump());
      CHECK(t.at("policy") == policy_path.string());
      CHECK(t.at("method") == methods[m].at("name"));
      CHECK(t.at("task") == s.at("task"));
      CHECK(t.at("sample") == n);
      CHECK(t.at("index") == seen[s.at("task").get<std::string>()]++);
      const auto prompt = s.at("prompt").get<std::vector<int64_t>>();
      CHECK(t.at("prompt_tokens") == prompt.size());
      CHECK(t.at("prompt_sha256") == eval::prompt_sha256(prompt));
      const auto generated = t.at("generated").get<std::vector<int64_t>>();
      CHECK(generated.size() == s.at("answer").size());
      CHECK(t.at("right") == (generated == s.at("answer").get<std::vector<int64_t>>()));
      right[s.at("task").get<std::string>()] += t.at("right").get<bool>() ? 1 : 0;
    }
    for (const auto& [task, counts] : methods[m].at("tasks_counts").items())
      CHECK(counts.at("right") == right[task]);
  }
  // Deterministic: a second run writes the same bytes.
  const fs::path again = tmp.path() / "again.jsonl";
  REQUIRE(
      headwise::testing::run_cli(common + " --write-tokens " + again.string(), tmp.path()).status ==
      0);
  CHECK(read_text_file(again) == read_text_file(tokens_path));

  // Refused in one line before anything runs, and nothing written.
  for (const auto& [extra, says] : std::vector<std::pair<std::string, std::string>>{
           {" --write-tokens " + (tmp.path() / "no-such-dir" / "t.jsonl").string(), "no-such-dir"},
           {" --write-tokens " + (tmp.path() / "t.jsonl").string() + " --write-samples " +
                (tmp.path() / "s.jsonl").string(),
            "--write-samples"}}) {
    const auto bad = headwise::testing::run_cli(common + extra, tmp.path());
    INFO(extra << ": " << bad.err);
    CHECK(bad.status == 1);
    CHECK(bad.err.find("--write-tokens") != std::string::npos);
    CHECK(bad.err.find(says) != std::string::npos);
    CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  }
  CHECK_FALSE(fs::exists(tmp.path() / "t.jsonl"));
  CHECK_FALSE(fs::exists(tmp.path() / "s.jsonl"));
}
