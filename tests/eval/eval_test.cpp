// eval through the CLI: several policies and --jobs in one run equal separate runs, a policy with
// h2o heads is measured at its own bytes, the ablation is used as given, baselines that cannot hold
// the policy's bytes are listed as not run, and bad input fails with one line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "eval_helpers.hpp"
#include "headwise/core/error.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/eval/tasks.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;
namespace fs = std::filesystem;
using headwise::testing::fixture_policy;
using headwise::testing::is_eviction_row;
using headwise::testing::method_row;
using headwise::testing::random_policy_windows;
using headwise::testing::Run;
using headwise::testing::run_cli;

TEST_CASE(
    "eval of several policies in one run equals one run per policy, sharing the budget-free work",
    "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  const std::vector<std::string> paths{(tmp.path() / "a.yaml").string(),
                                       (tmp.path() / "b.yaml").string()};
  // Two budgets at which every method here fits (duo streams 32 sink + 64 recent tokens per head
  // at this context; "eval reports the baselines ... not run" covers budgets where it does not).
  auto tight = fixture_policy(dir, {{1, {32, kFullWindow}}, {3, {kFullWindow, 8}}});
  policy::write_policy(paths[0], tight);
  policy::write_policy(
      paths[1], fixture_policy(dir, {{1, {kFullWindow, kFullWindow}}, {3, {kFullWindow, 32}}}));
  const std::string common =
      "eval --model " + dir.string() +
      " --samples 2 --calib-samples 2 --duo-steps 3 --seq-len 120 --prefill-chunk 50 --json --quiet"
      " --baselines full,uniform,retrieval-score,duo,snapkv";
  const Run both = run_cli(common + " --policy " + paths[0] + " --policy " + paths[1], tmp.path());
  INFO(both.err);
  REQUIRE(both.status == 0);
  const auto evaluations = nlohmann::json::parse(both.out).at("evaluations");
  REQUIRE(evaluations.size() == 2);
  for (size_t i = 0; i < paths.size(); ++i) {
    const Run one = run_cli(common + " --policy " + paths[i], tmp.path());
    REQUIRE(one.status == 0);
    const auto alone = nlohmann::json::parse(one.out);
    const auto& together = evaluations[i];
    CHECK(together.at("policy") == paths[i]);
    CHECK(together.at("policy_global_kv_bytes") == alone.at("policy_global_kv_bytes"));
    REQUIRE(together.at("methods").size() == alone.at("methods").size());
    for (size_t m = 0; m < alone.at("methods").size(); ++m) {
      const auto& a = alone["methods"][m];
      const auto& t = together["methods"][m];
      INFO(paths[i] << " " << a.at("name"));
      for (const char* key : {"name", "windows", "tasks", "kl_vs_full", "perplexity",
                              "global_kv_bytes", "cache_bytes_measured", "cache_bytes_estimated"}) {
        CHECK(t.at(key) == a.at(key));
      }
      if (a.contains("details") && a["details"].contains("gates"))
        CHECK(t["details"]["gates"] == a["details"]["gates"]);
    }
  }
  // Duo's gates (its streaming shape depends on the context alone) and the retrieval scores do
  // not depend on the budget: the same in both.
  const auto detail = [&](size_t e, const char* method, const char* key) {
    for (const auto& m : evaluations[e]["methods"]) {
      if (m["name"] == method) return m.at("details").at(key);
    }
    FAIL("no " << method);
    return nlohmann::json();
  };
  CHECK(detail(0, "duo", "recent_window") == 64);
  CHECK(detail(0, "duo", "sink_tokens") == 32);
  CHECK(detail(0, "duo", "gates") == detail(1, "duo", "gates"));
  CHECK(evaluations[0].at("methods_not_fitting").empty());
  CHECK(evaluations[1].at("methods_not_fitting").empty());
  CHECK(detail(0, "retrieval-score", "scores") == detail(1, "retrieval-score", "scores"));

  // Only budgets may differ: another serving shape is refused, naming the policy and the field.
  auto other_context = tight;
  other_context.context = 512;
  policy::fill_memory(other_context, spec);
  policy::write_policy(tmp.path() / "c.yaml", other_context);
  const Run refused =
      run_cli(common + " --policy " + paths[0] + " --policy " + (tmp.path() / "c.yaml").string(),
              tmp.path());
  CHECK(refused.status == 1);
  CHECK(refused.out.empty());
  CHECK(refused.err.find("c.yaml: context is 512") != std::string::npos);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
  const Run uneven = run_cli(common + " --policy " + paths[0] + " --policy " + paths[1] +
                                 " --unconditioned-policy " + paths[0],
                             tmp.path());
  CHECK(uneven.status == 1);
  CHECK(uneven.err.find("--unconditioned-policy given 1 times for 2 --policy") !=
        std::string::npos);
}

TEST_CASE("eval --jobs 2 gives the figures of --jobs 1 and runs a repeated method once", "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const std::string path = (tmp.path() / "a.yaml").string();
  // Bytes at which every method here fits (duo's streaming heads and the eviction methods'
  // bookkeeping need more than a policy of 8- and 32-token windows holds).
  policy::write_policy(path, fixture_policy(dir, {{1, {32, kFullWindow}}, {3, {kFullWindow, 8}}}));
  // The same policy twice: the second's methods are the first's runs; one thread per job in
  // both schedules, so the figures must agree to the last bit.
  const std::string common =
      "eval --model " + dir.string() + " --policy " + path + " --policy " + path +
      " --samples 2 --calib-samples 2 --duo-steps 3 --seq-len 120 --prefill-chunk 50 --json"
      " --baselines full,uniform,retrieval-score,duo,snapkv,h2o";
  const Run serial = run_cli(common + " --quiet --jobs 1", tmp.path());
  INFO(serial.err);
  REQUIRE(serial.status == 0);
  const Run parallel = run_cli(common + " --jobs 2 --threads-per-job 1", tmp.path());
  INFO(parallel.err);
  REQUIRE(parallel.status == 0);
  auto a = nlohmann::json::parse(serial.out).at("evaluations");
  auto b = nlohmann::json::parse(parallel.out).at("evaluations");
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  for (auto* doc : {&a, &b}) {
    for (auto& e : *doc) {
      for (auto& m : e["methods"]) {
        m.erase("prefill_tokens_per_s");  // timings
        m.erase("decode_tokens_per_s");
      }
    }
  }
  CHECK(a == b);
  CHECK(a[0]["methods"] == a[1]["methods"]);
  CHECK(a[0]["methods_not_fitting"].empty());  // every method ran
  // Every method of the second policy (full aside: the reference itself) reused a run, and so
  // did any method of the first whose windows and rule an earlier one had.
  size_t expected = a[1]["methods"].size() - 1;
  std::set<std::string> seen;
  for (const auto& m : a[0]["methods"]) {
    const std::string name = m["name"];
    if (name == "full") continue;
    const bool evicts = is_eviction_row(m);
    const bool own_sinks = m.contains("details") && m["details"].contains("sink_tokens");
    if (!seen.insert(m["windows"].dump() + (evicts ? name : "") +
                     (own_sinks ? m["details"]["sink_tokens"].dump() : ""))
             .second) {
      ++expected;
    }
  }
  size_t reused = 0;
  for (size_t at = parallel.err.find("its run is reused"); at != std::string::npos;
       at = parallel.err.find("its run is reused", at + 1)) {
    ++reused;
  }
  CHECK(reused == expected);
  CHECK(parallel.err.find("2 jobs at 1 intra-op thread each") != std::string::npos);

  // The thread count must not matter either: --jobs 1 at 4 and 16 intra-op threads, --jobs 2 at
  // 2 threads each (what a 4-core machine runs by default), give the 1-thread figures (eval's
  // sums are thread-count free and small GEMMs run on one MKL thread: core/reproducible_math).
  for (const auto& [jobs, threads] :
       std::vector<std::pair<std::string, std::string>>{{"1", "4"}, {"1", "16"}, {"2", "4"}}) {
    INFO("--jobs " << jobs << " at OMP_NUM_THREADS=" << threads);
    const Run r =
        run_cli(common + " --quiet --jobs " + jobs, tmp.path(), "OMP_NUM_THREADS=" + threads);
    REQUIRE(r.status == 0);
    auto c = nlohmann::json::parse(r.out).at("evaluations");
    for (auto& e : c) {
      for (auto& m : e["methods"]) {
        m.erase("prefill_tokens_per_s");
        m.erase("decode_tokens_per_s");
      }
    }
    CHECK(c == a);
  }
}

TEST_CASE("eval bad input: one line naming the flag, non-zero exit", "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  std::mt19937_64 rng(4);
  const auto p = fixture_policy(
      dir, random_policy_windows(arch::load_model_spec(dir), {8, 32, policy::kFull}, rng));
  const std::string policy_path = (tmp.path() / "policy.yaml").string();
  policy::write_policy(policy_path, p);
  const std::string base = "eval --policy " + policy_path + " --samples 1";
  const std::vector<std::pair<std::string, std::string>> cases{
      {base + " --model " + headwise::testing::fixture_dir("qwen3_next_tiny_b").string(),
       "--policy"},
      {base + " --model " + dir.string() + " --seq-len 120 --tasks needle_single,bogus",
       "--tasks bogus"},
      {base + " --model " + dir.string() + " --seq-len 120 --tasks niah_single", "tokenizer.json"},
      {base + " --model " + dir.string() + " --seq-len 120 --baselines uniform,bogus",
       "--baselines bogus"},
      {base + " --model " + dir.string() + " --seq-len 300", "--seq-len"},
      {base + " --model " + dir.string() + " --seq-len 120 --jobs 0", "--jobs"},
      {base + " --model " + dir.string() + " --seq-len 120 --jobs 2 --threads-per-job -1",
       "--threads-per-job"},
      {"eval --model " + dir.string() + " --policy " + (tmp.path() / "missing.yaml").string(),
       "missing.yaml"}};
  for (const auto& [args, needle] : cases) {
    const Run r = run_cli(args, tmp.path());
    INFO(args << "\n" << r.err);
    CHECK(r.status == 1);
    CHECK(r.out.empty());
    CHECK(r.err.find(needle) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE(
    "eval text tasks need a tokenizer that can write English; otherwise the token tasks are the "
    "default",
    "[eval]") {
  headwise::testing::TempDir tmp;
  auto folder_with_tokenizer = [&](const std::string& name, const fs::path& tokenizer) {
    const fs::path dir = tmp.path() / name;
    fs::create_directories(dir);
    write_file_atomically(dir / "tokenizer.json", read_text_file(tokenizer));
    return dir;
  };
  // The default model's tokenizer: 512 one-character tokens of its synthetic alphabet.
  const fs::path own_alphabet =
      folder_with_tokenizer("own", fs::path(HEADWISE_FIXTURES_DIR) / ".." / ".." / "models" /
                                       "tiny-qwen3-next" / "tokenizer.json");
  const fs::path english =
      folder_with_tokenizer("english", fs::path(HEADWISE_FIXTURES_DIR) / "tokenizers" /
                                           "bytelevel_qwen" / "tokenizer.json");

  CHECK(eval::default_tasks(own_alphabet) ==
        std::vector<std::string>{"needle_single", "needle_multikey", "needle_chain"});
  const auto english_defaults = eval::default_tasks(english);
  CHECK(std::find(english_defaults.begin(), english_defaults.end(), "niah_single") !=
        english_defaults.end());

  eval::TaskRequest request;
  request.tasks = {"niah_single"};
  request.samples = 1;
  request.seq_len = 256;
  try {
    eval::make_eval_samples(own_alphabet, 512, request);
    FAIL("a text task was accepted with a tokenizer that cannot write it");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--tasks niah_single") && Catch::Contains("cannot write"));
  }
  CHECK_FALSE(eval::make_eval_samples(english, 151936, request).empty());
}

TEST_CASE("eval refuses samples no longer than the policy's windows unless allowed, and says why",
          "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  memory::HeadWindows windows;
  for (int64_t id : spec.global_layer_ids()) windows[id] = std::vector<int64_t>(2, 32);
  windows.begin()->second.back() = policy::kFull;
  policy::write_policy(tmp.path() / "policy.yaml", fixture_policy(dir, windows));
  const std::string base =
      "eval --model " + dir.string() + " --policy " + (tmp.path() / "policy.yaml").string() +
      " --samples 1 --calib-samples 1 --baselines full,uniform --tasks needle_single";
  const Run refused = run_cli(base + " --seq-len 32", tmp.path());
  CHECK(refused.status == 1);
  CHECK(refused.out.empty());
  CHECK(refused.err.find(
            "--seq-len 32 is not longer than the policy's largest finite window (32 tokens)") !=
        std::string::npos);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);

  const Run allowed = run_cli(base + " --seq-len 32 --allow-short-seq-len --json", tmp.path());
  INFO(allowed.err);
  CHECK(allowed.status == 0);
  CHECK(allowed.err.find("the comparison does not show what the deployment will see") !=
        std::string::npos);

  // The default runs at the policy's context (256 tokens here): nothing to warn about.
  const Run at_context = run_cli(base + " --json", tmp.path());
  INFO(at_context.err);
  REQUIRE(at_context.status == 0);
  const auto j = nlohmann::json::parse(at_context.out);
  CHECK(j["seq_len"] == 256);
  for (const auto& m : j["methods"]) {
    const auto ci = m["tasks_ci95"]["needle_single"];
    const double acc = m["tasks"]["needle_single"];
    CHECK(ci[0].get<double>() <= acc);
    CHECK(ci[1].get<double>() >= acc);
  }
}

TEST_CASE(
    "eval --unconditioned-policy: the exact ablation is used as given, and only a true ablation is "
    "accepted",
    "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  std::mt19937_64 rng(8);
  const nlohmann::json provenance = {{"method", "seqcalib"},
                                     {"dataset_sha256", "ab12"},
                                     {"samples", 4},
                                     {"seq_len", 256},
                                     {"seed", 0},
                                     {"probe_samples", 2},
                                     {"distortion_measure", "answer-kl"},
                                     {"heads", "joint"}};
  auto policy = fixture_policy(dir, random_policy_windows(spec, {8, 32, policy::kFull}, rng));
  policy.calibration = provenance;
  auto ablation = fixture_policy(dir, random_policy_windows(spec, {8, 32, policy::kFull}, rng));
  ablation.calibration = provenance;
  ablation.calibration["method"] = "unconditioned";
  CHECK_NOTHROW(eval::check_unconditioned_ablation(policy, ablation, "a.yaml"));

  const auto refused = [&](const policy::Policy& bad, const std::string& field) {
    INFO(field);
    try {
      eval::check_unconditioned_ablation(policy, bad, "a.yaml");
      FAIL("accepted");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("--unconditioned-policy a.yaml") != std::string::npos);
      CHECK(std::string(e.what()).find(field) != std::string::npos);
    }
  };
  refused(policy, "'seqcalib'");  // the policy itself is not its own ablation
  for (const char* key : {"dataset_sha256", "samples", "seed", "heads"}) {
    auto bad = ablation;
    bad.calibration[key] = "other";
    refused(bad, std::string("calibration.") + key);
  }
  auto other_ladder = ablation;
  other_ladder.window_levels = {8, policy::kFull};
  refused(other_ladder, "window_levels");
  auto other_budget = ablation;
  other_budget.budget_gb = 2;
  refused(other_budget, "budget_gb");

  // Through the CLI: the unconditioned row has the given policy's windows.
  policy::write_policy(tmp.path() / "policy.yaml", policy);
  policy::write_policy(tmp.path() / "ablation.yaml", ablation);
  const Run r = run_cli("eval --model " + dir.string() + " --policy " +
                            (tmp.path() / "policy.yaml").string() + " --unconditioned-policy " +
                            (tmp.path() / "ablation.yaml").string() +
                            " --baselines unconditioned --samples 1 --seq-len 120 --json --quiet",
                        tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["methods"].size() == 2);
  const auto& row = j["methods"][1];
  CHECK(row["name"] == "unconditioned");
  CHECK(row["details"]["dataset_sha256"] == "ab12");
  for (const auto& [layer, heads] : ablation.head_windows()) {
    for (size_t h = 0; h < heads.size(); ++h) {
      const auto& w = row["windows"][std::to_string(layer)][h];
      CHECK((heads[h] == policy::kFull ? w == "full" : w == heads[h]));
    }
  }
}

TEST_CASE(
    "eval of a policy with h2o heads: measured bytes equal the policy's, bookkeeping included",
    "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  policy::Policy p = fixture_policy(dir, {{1, {8, 32}}, {3, {kFullWindow, 8}}});
  p.per_layer_policies[0].kv_head_rules = {policy::KeepRule::kH2O, policy::KeepRule::kWindow};
  p.per_layer_policies[1].kv_head_rules = {policy::KeepRule::kWindow, policy::KeepRule::kH2O};
  policy::fill_memory(p, spec);
  REQUIRE(p.memory.components.selection_state_bytes > 0);
  policy::write_policy(tmp.path() / "policy.yaml", p);
  const Run r = run_cli(
      "eval --model " + dir.string() + " --policy " + (tmp.path() / "policy.yaml").string() +
          " --baselines full,h2o,h2o-headwise-slots --samples 2 --seq-len 120 --prefill-chunk 50"
          " --json --quiet",
      tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const auto& row = method_row(j, "headwise");
  INFO(row.dump());
  CHECK(row.at("cache_bytes_measured") == p.memory.total_bytes);
  CHECK(row.at("cache_bytes_estimated") == p.memory.total_bytes);
  CHECK(row.at("global_kv_bytes") == p.memory.components.global_kv_bytes);
  // The eviction cache's positions and scores: exactly the policy's selection_state_bytes.
  CHECK(row.at("details").at("auxiliary_bytes_measured") ==
        p.memory.components.selection_state_bytes);
  // The ablation runs H2O in every head on the policy's slots. Both global layers here have h2o
  // heads, so the policy already pays every head's positions and scores: the ablation's bytes,
  // bookkeeping counted, are the policy's to the byte.
  const auto& slots = method_row(j, "h2o-headwise-slots");
  INFO(slots.dump());
  CHECK(slots.at("windows") == row.at("windows"));
  CHECK(slots.at("cache_bytes_estimated") == p.memory.total_bytes);
  CHECK(slots.at("cache_bytes_measured") == p.memory.total_bytes);
  CHECK(slots.at("details").at("auxiliary_bytes_measured") ==
        p.memory.components.selection_state_bytes);
  // H2O as published: one capacity for every head, the largest whose K/V and bookkeeping fit
  // the same bytes.
  const auto& own = method_row(j, "h2o");
  INFO(own.dump());
  std::set<nlohmann::json> capacities;
  for (const auto& [layer, heads] : own.at("windows").items()) {
    for (const auto& w : heads) capacities.insert(w);
  }
  CHECK(capacities.size() == 1);
  CHECK(own.at("cache_bytes_measured") == own.at("cache_bytes_estimated"));
  CHECK(own.at("cache_bytes_estimated").get<int64_t>() <= p.memory.total_bytes);
  CHECK(own.at("details").at("auxiliary_bytes_measured").get<int64_t>() > 0);
}

TEST_CASE(
    "eval reports the baselines that cannot hold the policy's bytes as not run, runs the rest",
    "[eval]") {
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  // 8-token windows (one block per head): below H2O's one block per head plus its bookkeeping,
  // and below duo's streaming heads (32 sink + 64 recent tokens at this context).
  const policy::Policy p = fixture_policy(dir, {{1, {8, 8}}, {3, {8, 8}}});
  const std::string path = (tmp.path() / "policy.yaml").string();
  policy::write_policy(path, p);
  memory::MemoryOptions o = p.memory_options();
  o.batch = 1;
  const int64_t budget = eval::global_kv_bytes(spec, p.head_windows(), o);
  const int64_t h2o_needs = eval::selecting_bytes(spec, memory::uniform_windows(spec, 1), o);
  memory::MemoryOptions duo_options = o;
  duo_options.sink_tokens = 32;
  const int64_t duo_needs =
      eval::global_kv_bytes(spec, memory::uniform_windows(spec, 64), duo_options);
  REQUIRE(h2o_needs > budget);
  REQUIRE(duo_needs > budget);
  const std::string common = "eval --model " + dir.string() + " --policy " + path +
                             " --samples 2 --calib-samples 2 --duo-steps 3 --seq-len 120"
                             " --prefill-chunk 50 --quiet --baselines full,uniform,h2o,duo,random";
  const Run r = run_cli(common + " --json", tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::vector<std::string> ran, not_run;
  for (const auto& m : j.at("methods")) ran.push_back(m.at("name"));
  for (const auto& m : j.at("methods_not_fitting")) not_run.push_back(m.at("name"));
  CHECK(ran == std::vector<std::string>{"headwise", "full", "uniform", "random"});
  CHECK(not_run == std::vector<std::string>{"h2o", "duo"});
  const auto reason = [&](size_t i) {
    return j.at("methods_not_fitting")[i].at("reason").get<std::string>();
  };
  CHECK(reason(0) ==
        fmt::format("uniform eviction baseline: its smallest assignment needs {} bytes "
                    "of global K/V plus selection bookkeeping (one block per head), "
                    "the policy has {}",
                    h2o_needs, budget));
  CHECK(reason(1) == fmt::format("duo baseline: every head streaming (32 sink + 64 recent tokens) "
                                 "needs {} global-KV bytes, the policy has {}",
                                 duo_needs, budget));
  CHECK_FALSE(j.at("paired_vs_headwise").contains("h2o"));
  CHECK_FALSE(j.at("paired_vs_headwise").contains("duo"));
  CHECK(j.at("paired_vs_headwise").contains("random"));
  // The table says it too, after the methods that ran.
  const Run text = run_cli(common, tmp.path());
  REQUIRE(text.status == 0);
  CHECK(text.out.find("h2o: not run: uniform eviction baseline") != std::string::npos);
  CHECK(text.out.find("duo: not run: duo baseline") != std::string::npos);
}
