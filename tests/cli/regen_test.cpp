// regen end to end on a tiny fixture, and the strict manifest reader.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <regex>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "cli_helpers.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/regen/manifest.hpp"

using namespace headwise;
using headwise::testing::CliRun;
using headwise::testing::run_cli_with;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = fs::path(HEADWISE_FIXTURES_DIR) / "qwen3_gqa";

std::string manifest_text(const std::string& seed) {
  return "policies:\n"
         "  - name: gqa\n"
         "    model: " +
         kFixture.string() +
         "\n"
         "    context: 4k\n"
         "    budget: 64k\n"
         "    windows: [16, 64, full]\n"
         "    samples: 2\n"
         "    seq_len: 128\n"
         "    seed: " +
         seed +
         "\n"
         "    output: gqa.yaml\n";
}

std::string manifest_error(const std::string& text) {
  try {
    regen::parse_manifest(text, "m.yaml", fs::path());
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("regen writes, skips what is up to date, and --check catches a hand edit", "[cli]") {
  testing::TempDir dir;
  const fs::path manifest = dir.path() / "manifest.yaml", policy_file = dir.path() / "gqa.yaml";
  write_file_atomically(manifest, manifest_text("1"));
  const std::string regen = "regen --manifest " + manifest.string() + " --quiet";

  CliRun r = run_cli_with("regen --manifest " + manifest.string());
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("gqa: gqa.yaml regenerated") != std::string::npos);
  const std::string first = read_text_file(policy_file);
  CHECK(first.find("inputs_sha256:") != std::string::npos);
  CHECK(first.find("model_path: ") != std::string::npos);
  CHECK_FALSE(testing::exists(dir.path() / "gqa.yaml.ckpt.json"));

  r = run_cli_with("regen --manifest " + manifest.string());
  CHECK(r.status == 0);
  CHECK(r.out.find("skipped: inputs unchanged") != std::string::npos);

  r = run_cli_with(regen + " --check");
  CHECK(r.status == 0);
  CHECK(r.out.empty());  // --quiet: nothing to say when everything is up to date

  // A hand edit: another window for one head, memory block made consistent again.
  policy::Policy edited = policy::read_policy(policy_file);
  auto& windows = edited.per_layer_policies.front().kv_head_windows;
  const int64_t before = windows.front();
  windows.front() = before == 16 ? kFullWindow : 16;
  policy::fill_memory(edited, arch::load_model_spec(kFixture));
  policy::write_policy(policy_file, edited);
  const std::string edited_text = read_text_file(policy_file);
  r = run_cli_with(regen + " --check");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find("gqa: gqa.yaml differs") != std::string::npos);
  CHECK(r.out.find(fmt::format("layer {} KV head 0: window {} → {}, bytes ",
                               edited.per_layer_policies.front().layer_id,
                               policy::window_name(windows.front()),
                               policy::window_name(before))) != std::string::npos);
  CHECK(r.out.find("memory.total_bytes: ") != std::string::npos);
  CHECK(r.err.find("regen --check: 1 of 1 policies differ") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find("--force") != std::string::npos);  // the advice that fixes it
  CHECK(read_text_file(policy_file) == edited_text);  // --check writes nothing

  // A distortion one ulp off, everything else as produced: --check compares bytes, so it differs
  // (calibration pins one CPU math branch: no float noise between CPUs to tolerate).
  policy::Policy nudged = policy::from_yaml(first, policy_file.string());
  double& cost = nudged.per_layer_policies.back().expected_distortion.front();
  cost = std::nextafter(cost, 1.0);
  policy::write_policy(policy_file, nudged);
  r = run_cli_with(regen + " --check");
  CHECK(r.status == 1);
  CHECK(r.out.find("expected_distortion changed in 1 layer(s)") != std::string::npos);
  policy::write_policy(policy_file, edited);

  // --force recalibrates although the inputs are unchanged (a changed tool): the edit is undone.
  r = run_cli_with(regen + " --force");
  CHECK(r.status == 0);
  CHECK(read_text_file(policy_file) == first);
  policy::write_policy(policy_file, edited);

  // The edit kept inputs_sha256, so plain regen would skip it: --check is what catches edits.
  // A changed input (the seed) is recalibrated.
  write_file_atomically(manifest, manifest_text("2"));
  r = run_cli_with("regen --manifest " + manifest.string());
  CHECK(r.status == 0);
  CHECK(r.out.find("regenerated") != std::string::npos);
  CHECK(read_text_file(policy_file) != edited_text);

  r = run_cli_with(regen + " --only nope");
  CHECK(r.status == 1);
  CHECK(r.err.find("--only: no entry 'nope'") != std::string::npos);

  // A policy in the manifest's folder that no entry lists fails --check (it could go stale).
  fs::copy_file(policy_file, dir.path() / "stray.yaml");
  r = run_cli_with(regen + " --check");
  CHECK(r.status == 1);
  CHECK(r.err.find("stray.yaml") != std::string::npos);
  CHECK(r.err.find("not listed in") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  fs::remove(dir.path() / "stray.yaml");

  fs::remove(policy_file);
  r = run_cli_with(regen + " --check");
  CHECK(r.status == 1);
  CHECK(r.out.find("gqa.yaml is missing") != std::string::npos);
  CHECK_FALSE(testing::exists(policy_file));
}

TEST_CASE("the manifest reader is strict and names the entry and key", "[policy]") {
  const std::string good =
      "policies:\n  - {name: a, model: m, context: 4k, budget: 1g, windows: '64,full', seed: 0, "
      "output: a.yaml}\n";
  const auto m = regen::parse_manifest(good, "m.yaml", "/base");
  REQUIRE(m.entries.size() == 1);
  CHECK(m.entries[0].request.at("model") == "/base/m");
  CHECK(m.entries[0].output == "/base/a.yaml");
  CHECK(m.entries[0].request.at("windows") == "64,full");
  CHECK_FALSE(m.entries[0].request.contains("samples"));
  CHECK(calib::parse_calibration_options(m.entries[0].request).samples ==
        8);  // the main command's default

  CHECK_THAT(
      manifest_error(
          "policies:\n  - {name: a, model: m, context: 4k, budget: 1g, windows: full, seed: 0, "
          "output: a.yaml, budgett: 2}\n"),
      Catch::Contains("m.yaml:2:") && Catch::Contains("entry 'a': budgett: unknown key"));
  CHECK_THAT(manifest_error("policies:\n  - {name: a, model: m, context: 4k, windows: full, seed: "
                            "0, output: a.yaml}\n"),
             Catch::Contains("entry 'a': budget: is missing"));
  CHECK_THAT(
      manifest_error(
          "policies:\n  - {name: a, model: m, context: 4k, budget: 1g, windows: full, seed: x, "
          "output: a.yaml}\n"),
      Catch::Contains("entry 'a': seed: 'x' is not an integer"));
  CHECK_THAT(manifest_error(good + "  - {name: a, model: m, context: 4k, budget: 1g, windows: "
                                   "full, seed: 0, output: b.yaml}\n"),
             Catch::Contains("'a' appears twice"));
  CHECK_THAT(manifest_error("entries: []\n"),
             Catch::Contains("entries: unknown key (allowed: policies, recalibrate_on_check)"));
  CHECK_THAT(manifest_error("policies: [\n"), Catch::Contains("malformed YAML"));
  CHECK_THAT(
      manifest_error(
          "policies:\n  - {name: 'a b', model: m, context: 4k, budget: 1g, windows: full, seed: 0, "
          "output: a.yaml}\n"),
      Catch::Contains("may hold only"));
}

namespace {

// Two entries of one fixture: `recalibrated` (regen --check recalibrates it) and `fingerprinted`
// (checked by its inputs fingerprint, at budget `budget_b`); `subset` is the manifest's last line.
std::string two_entry_manifest(const std::string& budget_b, const std::string& subset) {
  std::string text = "policies:\n";
  for (const auto& [name, budget] :
       {std::pair<std::string, std::string>{"recalibrated", "64k"}, {"fingerprinted", budget_b}}) {
    text += "  - name: " + name + "\n    model: " + kFixture.string() +
            "\n    context: 4k\n    budget: " + budget +
            "\n    windows: [16, 64, full]\n    samples: 2\n"
            "    seq_len: 128\n    seed: 1\n    output: " +
            name + ".yaml\n";
  }
  return text + subset;
}

}  // namespace

TEST_CASE("regen --check recalibrates the manifest's subset and checks the rest by fingerprint",
          "[cli]") {
  testing::TempDir dir;
  const fs::path manifest = dir.path() / "manifest.yaml";
  const fs::path cheap = dir.path() / "fingerprinted.yaml";
  const std::string subset = "recalibrate_on_check: [recalibrated]\n";
  write_file_atomically(manifest, two_entry_manifest("48k", subset));
  const std::string regen = "regen --manifest " + manifest.string();
  REQUIRE(run_cli_with(regen + " --quiet").status == 0);
  const std::string made = read_text_file(cheap);

  CliRun r = run_cli_with(regen + " --check");
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK(r.out.find("recalibrated: recalibrated.yaml is up to date\n") != std::string::npos);
  CHECK(r.out.find("fingerprinted: fingerprinted.yaml is up to date (inputs unchanged") !=
        std::string::npos);
  CHECK(r.out.find("not recalibrated") != std::string::npos);

  // A changed input of the fingerprinted entry (its budget) makes it stale without recalibrating.
  write_file_atomically(manifest, two_entry_manifest("40k", subset));
  r = run_cli_with(regen + " --check");
  CHECK(r.status == 1);
  CHECK(r.out.find("fingerprinted: fingerprinted.yaml is stale: its inputs changed") !=
        std::string::npos);
  CHECK(r.err.find("1 of 2 policies differ") != std::string::npos);
  write_file_atomically(manifest, two_entry_manifest("48k", subset));

  // A layout edit, and a memory block that disagrees with the model, are caught by the cheap check.
  write_file_atomically(cheap,
                        std::regex_replace(made, std::regex("block_size: 16"), "block_size:  16"));
  r = run_cli_with(regen + " --check");
  CHECK(r.status == 1);
  CHECK(r.out.find("fingerprinted.yaml is stale: not as headwise writes it") != std::string::npos);
  policy::Policy edited = policy::read_policy(dir.path() / "fingerprinted.yaml");
  edited.memory.total_bytes += 16;
  policy::write_policy(cheap, edited);
  r = run_cli_with(regen + " --check");
  CHECK(r.status == 1);
  CHECK(r.out.find("not a valid policy for its model") != std::string::npos);
  CHECK(r.out.find("memory.total_bytes") != std::string::npos);

  // A window edit that keeps the memory block consistent passes the fingerprint; --all recalibrates
  // every entry and catches it.
  edited = policy::from_yaml(made, "made");
  auto& windows = edited.per_layer_policies.front().kv_head_windows;
  windows.front() = windows.front() == 16 ? kFullWindow : 16;
  policy::fill_memory(edited, arch::load_model_spec(kFixture));
  policy::write_policy(cheap, edited);
  CHECK(run_cli_with(regen + " --check --quiet").status == 0);
  r = run_cli_with(regen + " --check --all");
  CHECK(r.status == 1);
  CHECK(r.out.find(
            "fingerprinted: fingerprinted.yaml differs from what the manifest entry produces") !=
        std::string::npos);
  CHECK(run_cli_with(regen + " --all").err.find("--all: only with --check") != std::string::npos);
}

TEST_CASE(
    "recalibrate_on_check names entries and covers every measure, keep-rules choice and method",
    "[policy]") {
  const std::string entries =
      "policies:\n"
      "  - {name: a, model: m, context: 4k, budget: 1g, windows: '64,full', seed: 0, output: "
      "a.yaml, distortion: answer-kl}\n"
      "  - {name: b, model: m, context: 4k, budget: 1g, windows: '64,full', seed: 0, output: "
      "b.yaml, keep_rules: window}\n"
      "  - {name: c, model: m, context: 4k, budget: 1g, windows: '64,full', seed: 0, output: "
      "c.yaml, keep_rules: window,"
      " conditioning: false}\n";
  const auto coverage_error = [&](const std::string& subset) {
    try {
      regen::check_recalibration_coverage(
          regen::parse_manifest(entries + subset, "m.yaml", fs::path()));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const auto m =
      regen::parse_manifest(entries + "recalibrate_on_check: [a, c]\n", "m.yaml", fs::path());
  REQUIRE(m.recalibrate_on_check.has_value());
  CHECK(m.recalibrated_on_check("a"));
  CHECK_FALSE(m.recalibrated_on_check("b"));
  CHECK(regen::parse_manifest(entries, "m.yaml", fs::path())
            .recalibrated_on_check("b"));  // no key: all
  CHECK(regen::calibration_kind(m.entries[0].request).keep_rules ==
        "window,h2o");  // auto under answer-kl
  // b and c name no measure: they use calibrate's default, whatever it is at the time.
  const std::string default_measure =
      calib::distortion_measure_name(calib::CalibrationOptions{}.distortion);
  CHECK(regen::calibration_kind(m.entries[1].request).measure == default_measure);

  // a: answer-kl + window,h2o; b: answer-tv + window; c: answer-tv + window, unconditioned.
  CHECK(coverage_error("recalibrate_on_check: [a, b, c]\n") == "(accepted)");
  CHECK(coverage_error("recalibrate_on_check: [a, c]\n") == "(accepted)");
  CHECK_THAT(coverage_error("recalibrate_on_check: [a, b]\n"),
             Catch::Contains("recalibrate_on_check") &&
                 Catch::Contains("method 'unconditioned' (used by c)"));
  CHECK_THAT(coverage_error("recalibrate_on_check: [b, c]\n"),
             Catch::Contains("distortion measure 'answer-kl' (used by a)"));
  // A new default measure leaves every entry without `distortion:` uncovered until one of them
  // is listed: the error names the measure, the entries that use it and what to do.
  CHECK_THAT(
      coverage_error("recalibrate_on_check: [a]\n"),
      Catch::Contains(
          "m.yaml: recalibrate_on_check: no entry it names calibrates with distortion measure '" +
          default_measure + "' (used by b, c)") &&
          Catch::Contains("list under recalibrate_on_check one entry that uses each of these"));
  CHECK_THAT(coverage_error("recalibrate_on_check: [c]\n"),  // every uncovered value, in one line
             Catch::Contains("distortion measure 'answer-kl' (used by a)") &&
                 Catch::Contains("keep rules 'window,h2o' (used by a)"));
  CHECK_THAT(manifest_error(entries + "recalibrate_on_check: [a, z]\n"),
             Catch::Contains("recalibrate_on_check: no entry 'z'"));
  CHECK_THAT(manifest_error(entries + "recalibrate_on_check: [a, a]\n"),
             Catch::Contains("'a' appears twice"));
  CHECK_THAT(manifest_error(entries + "recalibrate_on_check: a\n"),
             Catch::Contains("must be a list of entry names"));
}

TEST_CASE("regen replays a --decisions stable entry with how sure its decisions are", "[cli]") {
  testing::TempDir dir;
  const fs::path manifest = dir.path() / "manifest.yaml", policy_file = dir.path() / "stable.yaml";
  write_file_atomically(manifest,
                        "policies:\n  - name: stable\n    model: " +
                            (fs::path(HEADWISE_FIXTURES_DIR) / "qwen3_next_tiny").string() +
                            "\n    context: 512\n    budget: 20k\n"
                            "    windows: [8, 32, full]\n    samples: 8\n"
                            "    seq_len: 96\n    seed: 0\n    decisions: stable\n"
                            "    output: stable.yaml\n");
  const std::string regen = "regen --manifest " + manifest.string() + " --quiet";
  CliRun r = run_cli_with(regen);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const std::string written = read_text_file(policy_file);
  // Both global layers: the walk's decision and the keep rules'.
  const policy::Policy policy = policy::read_policy(policy_file);
  const nlohmann::json& layers = policy.calibration.at("decision_noise").at("layers");
  for (const char* layer : {"1", "3"}) {
    INFO("layer " << layer);
    CHECK(layers.at(layer).contains("walk"));
    CHECK(layers.at(layer).contains("keep_rules"));
  }
  r = run_cli_with(regen + " --check --all");
  CHECK(r.status == 0);  // recalibrated, the same bytes
  CHECK(read_text_file(policy_file) == written);

  // The summary is part of what --check compares: an edited gap is caught.
  policy::Policy edited = policy;
  auto& gap = edited.calibration["decision_noise"]["layers"]["1"]["walk"]["gap"];
  gap = std::nextafter(gap.get<double>(), 1.0);
  policy::write_policy(policy_file, edited);
  r = run_cli_with(regen + " --check --all");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.out.find("calibration.decision_noise: ") != std::string::npos);
}
