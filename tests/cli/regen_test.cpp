// regen end to end on a tiny fixture, and the strict manifest reader.
#include <catch2/catch.hpp>

#include <algorithm>

#include "../arch/fixture_reference.hpp"
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
         "    model: " + kFixture.string() + "\n"
         "    context: 4k\n"
         "    budget: 64k\n"
         "    windows: [16, 64, full]\n"
         "    samples: 2\n"
         "    seq_len: 128\n"
         "    seed: " + seed + "\n"
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
  CHECK(r.out.find(fmt::format("layer {} KV head 0: window {} → {}, bytes ", edited.per_layer_policies.front().layer_id,
                               policy::window_name(windows.front()), policy::window_name(before))) != std::string::npos);
  CHECK(r.out.find("memory.total_bytes: ") != std::string::npos);
  CHECK(r.err.find("regen --check: 1 of 1 policies differ") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find("--force") != std::string::npos);  // the advice that fixes it
  CHECK(read_text_file(policy_file) == edited_text);  // --check writes nothing

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
  const std::string good = "policies:\n  - {name: a, model: m, context: 4k, budget: 1g, windows: '64,full', seed: 0, output: a.yaml}\n";
  const auto m = regen::parse_manifest(good, "m.yaml", "/base");
  REQUIRE(m.entries.size() == 1);
  CHECK(m.entries[0].request.model == "/base/m");
  CHECK(m.entries[0].output == "/base/a.yaml");
  CHECK(m.entries[0].request.windows == "64,full");
  CHECK(m.entries[0].request.samples == 8);  // the main command's default

  CHECK_THAT(manifest_error("policies:\n  - {name: a, model: m, context: 4k, budget: 1g, windows: full, seed: 0, "
                            "output: a.yaml, budgett: 2}\n"),
             Catch::Contains("m.yaml:2:") && Catch::Contains("entry 'a': budgett: unknown key"));
  CHECK_THAT(manifest_error("policies:\n  - {name: a, model: m, context: 4k, windows: full, seed: 0, output: a.yaml}\n"),
             Catch::Contains("entry 'a': budget: is missing"));
  CHECK_THAT(manifest_error("policies:\n  - {name: a, model: m, context: 4k, budget: 1g, windows: full, seed: x, "
                            "output: a.yaml}\n"),
             Catch::Contains("entry 'a': seed: 'x' is not an integer"));
  CHECK_THAT(manifest_error(good + "  - {name: a, model: m, context: 4k, budget: 1g, windows: full, seed: 0, output: b.yaml}\n"),
             Catch::Contains("'a' appears twice"));
  CHECK_THAT(manifest_error("entries: []\n"), Catch::Contains("entries: unknown key (allowed: policies)"));
  CHECK_THAT(manifest_error("policies: [\n"), Catch::Contains("malformed YAML"));
  CHECK_THAT(manifest_error("policies:\n  - {name: 'a b', model: m, context: 4k, budget: 1g, windows: full, seed: 0, "
                            "output: a.yaml}\n"),
             Catch::Contains("may hold only"));
}
