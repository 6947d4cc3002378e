// eval's baselines and statistics without a run: each baseline spends the policy's bytes (within
// one block per head) in its own shape, the eviction baselines pay their bookkeeping from them, the
// PyramidKV and DuoAttention schedules, Wilson intervals and the paired comparison.
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "../test_configs.hpp"
#include "eval_helpers.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;
using headwise::testing::random_policy_windows;

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
