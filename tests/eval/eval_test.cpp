// eval: baselines at the policy's bytes (within one block per head), measured == estimated
// bytes through the CLI (a policy with h2o heads included), full KV has KL 0, the reported
// accuracies, KL and perplexity equal a teacher-forced masked forward computed here, and bad
// input fails with one line.
#include <c10/core/InferenceMode.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "../test_configs.hpp"
#include "eval_helpers.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/eval/tasks.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;
namespace fs = std::filesystem;
using headwise::testing::fixture_policy;
using headwise::testing::random_policy_windows;
using headwise::testing::Run;
using headwise::testing::run_cli;

namespace {

// An online eviction method's row (h2o, snapkv, adakv, pyramidkv, the chunked variants and the
// *-headwise-slots ablations): only those report the measured bookkeeping of the eviction cache.
bool is_eviction_row(const nlohmann::json& m) {
  return m.contains("details") && m["details"].contains("auxiliary_bytes_measured");
}

}  // namespace

namespace {

// Logits of `tokens` [1, T] with `windows` applied as masks over one full-sequence call (the
// calibration's PolicyAttentionCore), or the plain forward for full KV: no cache, no chunks, no
// greedy loop, apart from the runtime decoder eval runs.
at::Tensor masked_logits(arch::DecoderModel& model, const std::vector<int64_t>& tokens,
                         const memory::HeadWindows& windows, int64_t sink_tokens) {
  c10::InferenceMode inference;
  const at::Tensor ids = at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).view({1, -1});
  calib::PolicyAttentionCore core(windows, sink_tokens, 64);
  at::Tensor hidden = model.embed(ids);
  arch::LayerRun run;
  run.attention = &core;
  for (int64_t i = 0; i < model.spec().num_layers(); ++i) hidden = model.run_layer(i, hidden, run);
  return model.logits(hidden)[0];  // [T, V]
}

struct Recomputed {
  std::map<std::string, std::pair<int64_t, int64_t>> counts;  // task → (right, total)
  std::vector<at::Tensor> tails;                              // per sample: last k prompt log-probs
  double nll = 0;
  int64_t nll_tokens = 0;
};

// What eval reports for one method, recomputed from teacher-forced logits: a sample is right when
// the argmax at every answer row is the answer token (greedy decoding produces the answer exactly
// iff it does), perplexity over the prompts' next tokens, and the last `kl_positions` prompt rows.
Recomputed recompute(arch::DecoderModel& model, const std::vector<eval::EvalSample>& samples,
                     const memory::HeadWindows& windows, int64_t kl_positions,
                     int64_t sink_tokens = 0) {
  Recomputed r;
  for (const auto& s : samples) {
    const eval::TeacherForced tf = eval::teacher_forced(s);
    const at::Tensor logp =
        at::log_softmax(masked_logits(model, tf.tokens, windows, sink_tokens).to(at::kDouble), -1);
    bool right = true;
    for (size_t i = 0; i < s.answer.size(); ++i) {
      right =
          right && logp[tf.first_answer_row + static_cast<int64_t>(i)].argmax().item<int64_t>() ==
                       s.answer[i];
    }
    auto& [hits, total] = r.counts[s.task];
    hits += right ? 1 : 0;
    ++total;
    const auto p = static_cast<int64_t>(s.prompt.size());
    for (int64_t t = 0; t + 1 < p; ++t)
      r.nll -= logp[t][s.prompt[static_cast<size_t>(t + 1)]].item<double>();
    r.nll_tokens += p - 1;
    r.tails.push_back(logp.slice(0, p - std::min(kl_positions, p), p));
  }
  return r;
}

const nlohmann::json& method_row(const nlohmann::json& j, const std::string& name) {
  for (const auto& m : j.at("methods")) {
    if (m.at("name") == name) return m;
  }
  FAIL("no method " << name);
  return j;
}

memory::HeadWindows windows_of(const nlohmann::json& row) {
  memory::HeadWindows out;
  for (const auto& [layer, heads] : row.at("windows").items()) {
    for (const auto& w : heads)
      out[std::stoll(layer)].push_back(w.is_string() ? kFullWindow : w.get<int64_t>());
  }
  return out;
}

// Mean KL(full || method) per compared position, from the recomputed log-probabilities.
double kl_to_full(const Recomputed& full, const Recomputed& method) {
  double kl = 0;
  int64_t positions = 0;
  for (size_t i = 0; i < full.tails.size(); ++i) {
    kl += (full.tails[i].exp() * (full.tails[i] - method.tails[i])).sum().item<double>();
    positions += full.tails[i].size(0);
  }
  return kl / static_cast<double>(positions);
}

}  // namespace

TEST_CASE("eval baselines spend the policy's bytes to within one block per head", "[eval]") {
  std::mt19937_64 rng(5);
  const std::vector<int64_t> ladder{64, 256, 1024, kFullWindow};
  for (const auto& file :
       {"qwen3_next_80b_a3b.json", "gemma3_27b.json", "jamba_tiny.json", "falcon_h1_tiny.json"}) {
    const auto spec = headwise::testing::spec_from_config(file);
    for (int trial = 0; trial < 6; ++trial) {
      memory::MemoryOptions o;
      o.context = std::vector<int64_t>{4096, 3000, 100000}[static_cast<size_t>(trial % 3)];
      o.block_size = trial % 2 == 0 ? 16 : 1;
      o.sink_tokens = trial % 3 == 1 ? 4 : 0;
      const auto policy_windows = random_policy_windows(spec, ladder, rng);
      const int64_t budget = eval::global_kv_bytes(spec, policy_windows, o);
      const int64_t tolerance = eval::one_block_per_head(spec, o);
      eval::HeadScores scores;
      for (const auto& [layer, heads] : policy_windows) {
        for (size_t h = 0; h < heads.size(); ++h)
          scores[layer].push_back(std::uniform_real_distribution<double>()(rng));
      }
      const std::vector<std::pair<std::string, memory::HeadWindows>> baselines{
          {"uniform", eval::uniform_baseline(spec, o, budget)},
          {"pyramid", eval::pyramid_baseline(spec, o, budget)},
          {"random", eval::random_baseline(spec, o, budget, ladder, 17 + trial)},
          {"ranked-full",
           eval::ranked_full_baseline(spec, o, budget, scores, ladder.front(), "ranked-full")}};
      for (const auto& [name, windows] : baselines) {
        INFO(file << " trial " << trial << " " << name << " budget " << budget);
        memory::validate_windows(spec, windows);
        const int64_t bytes = eval::global_kv_bytes(spec, windows, o);
        CHECK(bytes <= budget);
        CHECK(budget - bytes < tolerance);
      }
    }
  }
}

TEST_CASE("eval baselines have their shapes: uniform is one window, pyramid decreases with depth",
          "[eval]") {
  const auto spec = headwise::testing::spec_from_config("gemma3_27b.json");
  memory::MemoryOptions o;
  o.context = 32768;
  o.block_size = 16;
  const auto full = memory::full_kv_windows(spec);
  const int64_t half = eval::global_kv_bytes(spec, full, o) / 2;
  const auto uniform = eval::uniform_baseline(spec, o, half);
  CHECK(uniform.begin()->second.front() == 16384);  // exactly half the context fits
  const auto pyramid = eval::pyramid_baseline(spec, o, half);
  const auto ids = spec.global_layer_ids();
  // Every head but the first layer's (which takes the top-up) follows the depth order.
  for (size_t j = 2; j < ids.size(); ++j)
    CHECK(pyramid.at(ids[j]).front() <= pyramid.at(ids[j - 1]).front());
  CHECK(pyramid.at(ids.front()).front() > pyramid.at(ids.back()).front());
}

TEST_CASE("eviction baselines at their own allocation pay their bookkeeping from the budget",
          "[eval]") {
  std::mt19937_64 rng(8);
  const std::vector<int64_t> ladder{64, 256, 1024, kFullWindow};
  for (const auto& file : {"qwen3_next_80b_a3b.json", "gemma3_27b.json", "jamba_tiny.json"}) {
    const auto spec = headwise::testing::spec_from_config(file);
    const auto ids = spec.global_layer_ids();
    for (int trial = 0; trial < 4; ++trial) {
      memory::MemoryOptions o;
      o.context = std::vector<int64_t>{4096, 32768}[static_cast<size_t>(trial % 2)];
      o.block_size = trial < 2 ? 16 : 1;
      const int64_t budget =
          eval::global_kv_bytes(spec, random_policy_windows(spec, ladder, rng), o);
      INFO(file << " trial " << trial << " budget " << budget);
      // One more block per head (K/V and its bookkeeping) would not fit.
      int64_t block_cost = eval::one_block_per_head(spec, o);
      for (int64_t id : ids) {
        const auto& att = *spec.layer(id).attention;
        block_cost += att.num_kv_heads * o.block_size * 12 *
                      o.batch;  // position int64 + score float32 per slot
      }
      const auto uniform = eval::uniform_selecting_baseline(spec, o, budget);
      const int64_t used = eval::selecting_bytes(spec, uniform, o);
      CHECK(used <= budget);
      CHECK(budget - used < block_cost);
      CHECK(used > eval::global_kv_bytes(spec, uniform, o));  // the bookkeeping is counted
      std::set<int64_t> one_window;
      for (const auto& [layer, heads] : uniform) one_window.insert(heads.begin(), heads.end());
      CHECK(one_window.size() == 1);

      const auto pyramid = eval::pyramidkv_baseline(spec, o, budget, 32, 20);
      CHECK(eval::selecting_bytes(spec, pyramid.windows, o) <= budget);
      if (pyramid.pyramidal) {
        // Non-increasing with depth, strictly from the first global layer to the last.
        for (size_t j = 1; j < ids.size(); ++j) {
          const int64_t above = pyramid.windows.at(ids[j - 1]).front(),
                        here = pyramid.windows.at(ids[j]).front();
          CHECK((above == kFullWindow || (here != kFullWindow && here <= above)));
        }
        if (ids.size() > 1)
          CHECK(pyramid.windows.at(ids.front()).front() != pyramid.windows.at(ids.back()).front());
      } else {
        CHECK(pyramid.windows == uniform);
      }
    }
  }
}

TEST_CASE(
    "PyramidKV's schedule: min = P / beta at the top, max = 2P - min at the bottom, plus the "
    "window",
    "[eval]") {
  const auto spec = headwise::testing::spec_from_config("gemma3_27b.json");
  memory::MemoryOptions o;
  o.context = 32768;
  o.block_size = 1;
  const auto ids = spec.global_layer_ids();
  REQUIRE(ids.size() > 2);
  const int64_t budget = eval::global_kv_bytes(spec, memory::uniform_windows(spec, 4096), o);
  const auto a = eval::pyramidkv_baseline(spec, o, budget, 32, 20);
  REQUIRE(a.pyramidal);
  const double p = static_cast<double>(a.mean_prefix);
  CHECK(a.windows.at(ids.front()).front() == 32 + std::llround(2 * p - p / 20));
  CHECK(a.windows.at(ids.back()).front() == 32 + std::llround(p / 20));
  // P is the largest that fits: one more token of mean prefix does not.
  CHECK(eval::selecting_bytes(spec, a.windows, o) <= budget);
  // A budget too small for min >= window falls back to uniform, as PyramidKV's code does.
  const int64_t small = eval::global_kv_bytes(spec, memory::uniform_windows(spec, 200), o);
  const auto b = eval::pyramidkv_baseline(spec, o, small, 32, 20);
  CHECK_FALSE(b.pyramidal);
  CHECK(b.windows == eval::uniform_selecting_baseline(spec, o, small));
}

TEST_CASE("DuoAttention's learning-rate schedule: warm-up and cool-down over steps/5, floor 0.1",
          "[eval]") {
  CHECK(eval::duo_lr_factor(0, 2000) == Approx(0.1));
  CHECK(eval::duo_lr_factor(199, 2000) == Approx(0.5));
  CHECK(eval::duo_lr_factor(1000, 2000) == Approx(1.0));
  CHECK(eval::duo_lr_factor(1800, 2000) == Approx(0.5));
  CHECK(eval::duo_lr_factor(1999, 2000) == Approx(0.1));
  CHECK(eval::duo_lr_factor(2, 3) == Approx(1.0));
}

TEST_CASE("eval --json: every method, measured == estimated bytes, full has KL 0", "[eval]") {
  // Every hybrid family with a forward: gated DeltaNet (Qwen3-Next, Qwen3.5-MoE), gpt-oss (sliding
  // layers, sink logits), LFM2 (short convolutions), the Mamba-2 hybrids (Bamba, Nemotron-H,
  // Granite 4.0-H, Falcon-H1) and Jamba (Mamba-1).
  const auto fixture = GENERATE(as<std::string>{}, "qwen3_next_tiny", "qwen3_5_moe_tiny",
                                "gpt_oss_tiny", "lfm2_tiny", "bamba_tiny", "nemotron_h_tiny",
                                "granitemoehybrid_tiny", "jamba_tiny", "falcon_h1_tiny");
  INFO(fixture);
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir(fixture);
  const auto spec = arch::load_model_spec(dir);
  // Windows full, 8, 32, full, 8, ... over the global KV heads: every window kind, and bytes at
  // which every baseline fits on every family (duo's streaming heads keep 32 sink + 64 recent
  // tokens at this context; the fixtures' smallest mean is 107 tokens per head).
  memory::HeadWindows windows;
  size_t head = 0;
  for (int64_t id : spec.global_layer_ids()) {
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h, ++head) {
      windows[id].push_back(std::vector<int64_t>{policy::kFull, 8, 32}[head % 3]);
    }
  }
  const auto p = fixture_policy(dir, windows);
  policy::write_policy(tmp.path() / "policy.yaml", p);
  // Few duo steps: this case checks every method's rows and bytes, not the gates' quality.
  // 240-token samples: at these bytes the methods at their own allocation keep about 110 tokens
  // per head, so they truncate much of every sample, not only its first few tokens.
  const Run r = run_cli(
      "eval --model " + dir.string() + " --policy " + (tmp.path() / "policy.yaml").string() +
          " --samples 2 --calib-samples 2 --duo-steps 8 --seq-len 240 --prefill-chunk 50 --json"
          " --quiet",
      tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const int64_t budget = j["policy_global_kv_bytes"], tolerance = j["one_block_per_head_bytes"];
  // KL to full KV, computed another way: the same samples through a full-sequence forward with
  // each static method's windows as masks (no cache, no chunks, no decoder).
  const auto samples =
      eval::make_eval_samples(dir, spec.vocab_size, eval::TaskRequest{{}, 2, 240, /*seed=*/0});
  auto model = arch::load_model(dir, arch::ModelOptions{});
  const int64_t kl_positions = 512;  // eval's default: every prompt position here
  const Recomputed full_kv =
      recompute(*model, samples, memory::full_kv_windows(spec), kl_positions);
  // Every method ran, in order: at these bytes each baseline has a configuration that fits.
  CHECK(j.at("methods_not_fitting").empty());
  std::vector<std::string> names;
  for (const auto& m : j["methods"]) names.push_back(m["name"]);
  CHECK(names == eval::method_names());
  const int64_t policy_bytes = j["methods"][0]["cache_bytes_estimated"];
  for (const auto& m : j["methods"]) {
    INFO(m.dump());
    CHECK(m["cache_bytes_measured"] == m["cache_bytes_estimated"]);
    CHECK(m["tasks"].size() == eval::default_tasks(dir).size());
    for (const auto& [task, acc] : m["tasks"].items())
      CHECK((acc.get<double>() >= 0 && acc.get<double>() <= 1));
    const int64_t bytes = m["global_kv_bytes"];
    const std::string name = m["name"];
    const double kl = m["kl_vs_full"].get<double>();
    if (is_eviction_row(m)) {
      // SnapKV, AdaKV and PyramidKV staged compute the prompt's logits at full KV before they
      // compress, so they equal full KV's there; H2O and the chunked rules evict during prefill.
      const bool staged = !name.starts_with("h2o") && name.find("chunked") == std::string::npos;
      if (staged) {
        CHECK(kl == Approx(0.0).margin(1e-12));
      } else {
        // No reference short of reimplementing the eviction: they must at least differ from full
        // KV, which a run that evicted nothing (or reported the full run's KL) would not.
        CHECK(kl > 0.0);
      }
    } else if (name != "full") {
      const auto& details = m.value("details", nlohmann::json::object());
      const int64_t sinks = details.value("sink_tokens", p.sink_tokens);
      const Recomputed masked = recompute(*model, samples, windows_of(m), kl_positions, sinks);
      // float32 noise: a few 1e-9 absolute on these random-weight fixtures, whose KLs are 1e-8 to
      // 1e-3 (measured: every static row of every fixture within 8e-9 or 1e-5 relative).
      CHECK(kl == Approx(kl_to_full(full_kv, masked)).epsilon(1e-2).margin(3e-8));
    }
    const bool on_policy_slots = name.ends_with("-headwise-slots");
    if (name == "full") {
      CHECK(m["kl_vs_full"].get<double>() == 0.0);
    } else if (name == "headwise") {
      CHECK(bytes == budget);
    } else if (is_eviction_row(m)) {
      const auto& d = m.at("details");
      CHECK(d.at("method") == name);
      const int64_t bookkeeping = d.at("auxiliary_bytes_measured");
      CHECK(bookkeeping > 0);
      // The bookkeeping is part of the method's bytes, as the policy's own is of its.
      CHECK(m["cache_bytes_measured"].get<int64_t>() - bookkeeping ==
            j["methods"][1]["cache_bytes_measured"].get<int64_t>() -
                j["methods"][1]["global_kv_bytes"].get<int64_t>() + bytes);
      if (on_policy_slots) {
        // The ablation: the policy's own slots, so its K/V bytes exactly and its bookkeeping on
        // top.
        CHECK(bytes == budget);
        CHECK(m["cache_bytes_estimated"].get<int64_t>() > policy_bytes);
      } else {
        // As published: its own allocation of the policy's bytes, bookkeeping included.
        CHECK(m["cache_bytes_estimated"].get<int64_t>() <= policy_bytes);
      }
      // SnapKV/AdaKV/PyramidKV stage the prompt's K/V before compressing (full KV at the prefill
      // peak); chunked, they compress after every prefill chunk and stage nothing, as H2O.
      const bool staged = !name.starts_with("h2o") && name.find("chunked") == std::string::npos;
      CHECK((d.at("prefill_staged_peak_bytes_measured").get<int64_t>() > 0) == staged);
    } else if (name == "unconditioned") {
      CHECK(bytes <= budget);  // ladder levels only, like the policy itself
    } else {
      // Static windows (a window needs no bookkeeping): the policy's bytes, within one block per
      // head.
      CHECK(m["cache_bytes_estimated"].get<int64_t>() <= policy_bytes);
      CHECK(policy_bytes - m["cache_bytes_estimated"].get<int64_t>() < tolerance);
    }
  }
  CHECK(j["methods"][0]["cache_bytes_estimated"] == p.memory.total_bytes);
  // headwise against every other method on the same samples.
  for (const auto& name : {"full", "uniform", "unconditioned"}) {
    INFO(name);
    const auto& paired = j.at("paired_vs_headwise").at(name);
    CHECK(paired.at("samples").get<int64_t>() > 0);
    CHECK(paired.at("mcnemar_p").get<double>() <= 1.0);
  }
  CHECK_FALSE(j.at("paired_vs_headwise").contains("headwise"));
}

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

TEST_CASE("Wilson intervals and sample spreads", "[eval]") {
  // Reference values: the Wilson score interval at z = 1.96 (e.g. statsmodels proportion_confint).
  const auto [lo0, hi0] = eval::wilson_interval(0, 10);
  CHECK(lo0 == Approx(0.0).margin(1e-12));
  CHECK(hi0 == Approx(0.277533).margin(1e-6));
  const auto [lo5, hi5] = eval::wilson_interval(5, 10);
  CHECK(lo5 == Approx(0.236593).margin(1e-6));
  CHECK(hi5 == Approx(0.763407).margin(1e-6));
  const auto [lo100, hi100] = eval::wilson_interval(90, 100);
  CHECK(lo100 == Approx(0.825634).margin(1e-6));
  CHECK(hi100 == Approx(0.944771).margin(1e-6));
  const auto [mean, half] = eval::mean_and_ci95({1.0, 2.0, 3.0, 4.0});
  CHECK(mean == 2.5);
  CHECK(half == Approx(1.959964 * std::sqrt(1.6666667 / 4)).epsilon(1e-6));
  CHECK(eval::largest_finite_window({{1, {64, policy::kFull}}, {3, {128, 16}}}) == 128);
}

TEST_CASE("paired comparison on the same samples: exact McNemar and the paired difference",
          "[eval]") {
  // 100 samples: both right on 50, only a on 10, only b on 2, neither on 38.
  eval::MethodResult a, b;
  for (int i = 0; i < 100; ++i) {
    a.correct_per_sample.push_back(i < 60 ? 1 : 0);
    b.correct_per_sample.push_back(i < 50 || (i >= 60 && i < 62) ? 1 : 0);
    a.kl_per_sample.push_back(0.1);
    b.kl_per_sample.push_back(0.3 + 0.01 * (i % 2));
  }
  const auto c = eval::paired_comparison(a, b);
  CHECK(c.only_a == 10);
  CHECK(c.only_b == 2);
  CHECK(c.accuracy_difference == Approx(0.08));
  // Two-sided exact binomial on 12 discordant samples, 2 the other way: 2 * 79 / 4096
  // (scipy.stats.binomtest(2, 12).pvalue).
  CHECK(c.mcnemar_p == Approx(0.0385742).margin(1e-7));
  const double half = 1.959964 * std::sqrt(12.0 - 64.0 / 100.0) / 100.0;
  CHECK(c.accuracy_difference_ci95.first == Approx(0.08 - half).margin(1e-6));
  CHECK(c.kl_difference == Approx(-0.205));
  // Equal methods: no discordant sample, p = 1, difference 0.
  const auto same = eval::paired_comparison(a, a);
  CHECK(same.mcnemar_p == 1.0);
  CHECK(same.accuracy_difference == 0.0);
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
    "eval's accuracies, KL and perplexity equal a teacher-forced masked forward computed here",
    "[eval]") {
  // The 2K default model, trained on these tasks (accuracies are neither all 0 nor all 1), under a
  // policy with float32 K/V and states: the decoder then computes what the masked reference does,
  // so every figure must agree (counts exactly, KL and perplexity to float rounding).
  headwise::testing::TempDir tmp;
  const fs::path dir = fs::path(HEADWISE_SOURCE_DIR) / "models" / "tiny-qwen3-next";
  const auto spec = arch::load_model_spec(dir);
  policy::Policy p =
      fixture_policy(dir, {{1, {32, kFullWindow, 32, 64}}, {3, {64, 32, kFullWindow, 32}}});
  p.context = 512;
  p.sink_tokens = 0;
  p.state_dtype = DType::kFloat32;
  p.window_levels = {32, 64, kFullWindow};
  policy::fill_memory(p, spec);
  policy::write_policy(tmp.path() / "policy.yaml", p);
  const int64_t kl_positions = 100;
  const Run r = run_cli("eval --model " + dir.string() + " --policy " +
                            (tmp.path() / "policy.yaml").string() +
                            " --baselines full,uniform --tasks needle_single,needle_multikey "
                            "--samples 6 --seq-len 320"
                            " --prefill-chunk 64 --kl-positions " +
                            std::to_string(kl_positions) + " --json --quiet",
                        tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("state_dtype") == "float32");

  eval::TaskRequest request{
      {"needle_single", "needle_multikey"}, 6, 320, 0};  // eval's defaults: seed 0
  const auto samples = eval::make_eval_samples(dir, spec.vocab_size, request);
  auto model = arch::load_model(dir, arch::ModelOptions{});
  const Recomputed full = recompute(*model, samples, memory::full_kv_windows(spec), kl_positions);
  int64_t right_anywhere = 0, wrong_anywhere = 0;
  for (const char* name : {"full", "headwise", "uniform"}) {
    const auto& row = method_row(j, name);
    INFO(name << ": " << row.dump());
    const Recomputed mine = recompute(*model, samples, windows_of(row), kl_positions);
    for (const auto& [task, counts] : mine.counts) {
      CHECK(row.at("tasks_counts").at(task).at("right") == counts.first);
      CHECK(row.at("tasks_counts").at(task).at("total") == counts.second);
      CHECK(row.at("tasks").at(task).get<double>() ==
            Approx(static_cast<double>(counts.first) / counts.second));
      right_anywhere += counts.first;
      wrong_anywhere += counts.second - counts.first;
    }
    CHECK(row.at("perplexity").get<double>() ==
          Approx(std::exp(mine.nll / static_cast<double>(mine.nll_tokens))).epsilon(1e-5));
    CHECK(row.at("kl_vs_full").get<double>() ==
          Approx(kl_to_full(full, mine)).epsilon(1e-3).margin(1e-7));
  }
  // The comparison must be able to disagree: some answers right, some wrong.
  CHECK(right_anywhere > 0);
  CHECK(wrong_anywhere > 0);
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
