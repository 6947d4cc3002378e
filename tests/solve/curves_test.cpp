#include <catch2/catch.hpp>

#include "../support/temp_dir.hpp"

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "headwise/core/error.hpp"
#include "headwise/solve/curves.hpp"
#include "headwise/solve/mckp.hpp"

using namespace headwise;
using namespace headwise::solve;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kCurves = R"({
  "model": "extra keys are fine: reports embed curves",
  "heads": [
    {"layer_id": 3, "kv_head": 0, "options": [
      {"window": 1024, "bytes": 1048576, "distortion": 0.5},
      {"window": 4096, "bytes": 4194304, "distortion": 0.125},
      {"window": "full", "bytes": 16777216, "distortion": 0.0}]},
    {"layer_id": 3, "kv_head": 1, "options": [
      {"window": 1024, "bytes": 1048576, "distortion": 0.25},
      {"window": 4096, "bytes": 4194304, "distortion": 0.0625},
      {"window": "full", "bytes": 16777216, "distortion": 0.0}]}
  ]})";

struct Run {
  int status;
  std::string output;  // stdout then stderr
  double wall_ms;      // the whole child process, measured here
};

Run run_cli(const std::string& arguments) {
  const auto start = std::chrono::steady_clock::now();
  const auto r = headwise::testing::run_cli(arguments);
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return {r.status, r.out + r.err, wall_ms};
}

// A time the command reports for part of its work: positive (the clock ran) and below the wall
// time of the whole process, measured here around it (a wrong unit or an unset value fails).
void check_part_of(double reported_ms, const Run& run) {
  CHECK(reported_ms > 0.0);
  CHECK(reported_ms < run.wall_ms);
}

void expect_parse_error(const std::string& text, const std::string& fragment) {
  try {
    groups_from_json(json::parse(text), "curves.json");
    FAIL("accepted: " << text);
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("curves.json") && Catch::Contains(fragment));
  }
}

}  // namespace

TEST_CASE("curves files parse, round-trip and reject bad keys", "[solve]") {
  const auto groups = groups_from_json(json::parse(kCurves), "curves.json");
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].layer_id == 3);
  CHECK(groups[1].kv_head == 1);
  CHECK(groups[0].options[2].window == kFullWindow);
  CHECK(groups[0].options[1].bytes == 4194304);
  CHECK(groups[1].options[1].distortion == 0.0625);
  const auto again = groups_from_json(groups_to_json(groups), "again");
  CHECK(groups_to_json(again) == groups_to_json(groups));

  expect_parse_error("[]", "\"heads\"");
  expect_parse_error("{}", "missing key \"heads\"");
  expect_parse_error(R"({"heads": []})", "non-empty");
  expect_parse_error(R"({"heads": [{"kv_head": 0, "options": []}]})",
                     "heads[0]: missing key \"layer_id\"");
  expect_parse_error(R"({"heads": [{"layer_id": 0, "kv_head": 0}]})", "missing key \"options\"");
  expect_parse_error(
      R"({"heads": [{"layer_id": 0, "kv_head": 0, "options": [{"window": 1, "distortion": 0}]}]})",
      "heads[0].options[0]: missing key \"bytes\"");
  expect_parse_error(
      R"({"heads": [{"layer_id": 0, "kv_head": 0, "options": [{"window": 1, "bytes": 1.5, "distortion": 0}]}]})",
      "heads[0].options[0].bytes");
  expect_parse_error(
      R"({"heads": [{"layer_id": 0, "kv_head": 0, "options": [{"window": "half", "bytes": 1, "distortion": 0}]}]})",
      "heads[0].options[0].window");
  expect_parse_error(
      R"({"heads": [{"layer_id": 0, "kv_head": 0, "options": [{"window": 1, "bytes": 1, "distortion": "x"}]}]})",
      "heads[0].options[0].distortion");
  expect_parse_error(
      R"({"heads": [{"layer_id": 0, "kv_head": 0, "options": [{"window": 1, "bytes": 1, "distortion": -1}]}]})",
      "layer 0 KV head 0");
  expect_parse_error(R"({"heads": [{"layer_id": 0, "kv_head": 0, "options": []}]})",
                     "no window options");
  expect_parse_error(
      R"({"heads": [{"layer_id": 1, "kv_head": 0, "options": [{"window": 1, "bytes": 1, "distortion": 0}]},
                                   {"layer_id": 1, "kv_head": 0, "options": [{"window": 1, "bytes": 1, "distortion": 0}]}]})",
      "heads[1]: layer 1 KV head 0 listed twice");

  headwise::testing::TempDir dir("solve");
  try {
    read_curves_file(dir.write("broken.json", "{\"heads\": ["));
    FAIL("accepted malformed JSON");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("broken.json"));
  }
  CHECK_THROWS_AS(read_curves_file(dir / "missing.json"), InputError);
}

TEST_CASE("solution JSON lists every head's window", "[solve]") {
  const auto groups = groups_from_json(json::parse(kCurves), "curves.json");
  const auto result = solve_exact(groups, 5 * 1048576);
  const json out = solution_to_json(groups, result);
  CHECK(out["total_bytes"] == 5 * 1048576);
  CHECK(out["total_distortion"] == 0.375);  // (4096, 1024) beats (1024, 4096): 0.5625
  REQUIRE(out["choices"].size() == 2);
  CHECK(out["choices"][0]["layer_id"] == 3);
  CHECK(out["choices"][1]["kv_head"] == 1);
}

TEST_CASE("headwise-calc solve re-solves stored curves", "[solve]") {
  headwise::testing::TempDir dir("solve");
  const auto curves = dir.write("curves.json", kCurves);

  const Run json_run = run_cli("solve --curves " + curves.string() + " --budget 5m --json --quiet");
  REQUIRE(json_run.status == 0);
  const json out = json::parse(json_run.output);
  const auto expected = solve_exact(read_curves_file(curves), 5 * 1048576);
  CHECK(out["total_bytes"] == expected.total_bytes);
  CHECK(out["total_distortion"] == expected.total_distortion);
  CHECK(out["approximate"] == true);
  CHECK(out["proven_optimal"] == true);
  check_part_of(out["solve_ms"].get<double>(), json_run);
  REQUIRE(out["choices"].size() == 2);
  CHECK(out["choices"][0] == json({{"layer_id", 3}, {"kv_head", 0}, {"window", 4096}}));
  CHECK(out["choices"][1] == json({{"layer_id", 3}, {"kv_head", 1}, {"window", 1024}}));

  const Run full = run_cli("solve --curves " + curves.string() + " --budget 32m --json --quiet");
  REQUIRE(full.status == 0);
  // Named: a range-for over a member of a temporary reads freed memory (ASan caught it).
  const json full_out = json::parse(full.output);
  for (const auto& choice : full_out["choices"]) CHECK(choice["window"] == "full");

  const Run human = run_cli("solve --curves " + curves.string() + " --budget 5m --quiet");
  CHECK(human.status == 0);
  CHECK_THAT(human.output,
             Catch::Contains("layer   3: 4096 1024") && Catch::Contains("approximate"));

  const Run infeasible = run_cli("solve --curves " + curves.string() + " --budget 1m");
  CHECK(infeasible.status == 3);
  CHECK_THAT(infeasible.output, Catch::Contains("2097152 B"));

  const Run broken =
      run_cli("solve --curves " +
              dir.write("bad.json", R"({"heads": [{"layer_id": 0}]})").string() + " --budget 1g");
  CHECK(broken.status == 1);
  CHECK_THAT(broken.output, Catch::Contains("bad.json") && Catch::Contains("kv_head"));

  const Run bad_budget = run_cli("solve --curves " + curves.string() + " --budget lots");
  CHECK(bad_budget.status == 1);
  CHECK_THAT(bad_budget.output, Catch::Contains("--budget"));

  const Run no_budget = run_cli("solve --curves " + curves.string());
  CHECK(no_budget.status == 1);
  CHECK_THAT(no_budget.output, Catch::Contains("--budget"));

  const Run bench = run_cli("solve --bench --bench-layers 8 --bench-heads 4 --bench-levels 5");
  REQUIRE(bench.status == 0);
  const json figures = json::parse(bench.output);
  CHECK(figures["groups"] == 32);
  CHECK(figures["levels"] == 5);
  check_part_of(figures["solver_ms"].get<double>(), bench);
}
