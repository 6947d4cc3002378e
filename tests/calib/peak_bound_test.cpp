// --prefill-peak in the joint keep-rule pass (calib/rules/peak_bound.hpp; docs/keep-rules.md,
// "Bounding the prefill peak"): the solve keeps the steady bytes within the budget and the prefill
// peak within the bound, exactly in bytes, under either schedule; the leftover's upgrades keep it.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "../arch/fixture_reference.hpp"
#include "calib/job/input_checks.hpp"
#include "calib/rules/joint_rules.hpp"
#include "calib/rules/peak_bound.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/prefill_peak.hpp"
#include "headwise/regen/manifest.hpp"
#include "toy_model.hpp"

using namespace headwise;

namespace {

using calib::joint::PeakBound;
using calib::joint::StagedGroup;
using policy::KeepRule;
using runtime::PrefillSchedule;

constexpr int64_t kPrompt = 160;  // the toys' context, the prompt the bound assumes

// The least total distortion (summed in group order) of any choice with bytes <= budget and
// bytes + staging at once <= bound, by trying every choice; infinity when none fits.
double brute_force(const std::vector<StagedGroup>& groups, int64_t budget, int64_t bound,
                   PrefillSchedule schedule) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<size_t> choice(groups.size(), 0);
  for (;;) {
    int64_t bytes = 0;
    double distortion = 0.0;
    for (size_t g = 0; g < groups.size(); ++g) {
      bytes += groups[g].options[choice[g]].bytes;
      distortion += groups[g].options[choice[g]].distortion;
    }
    const int64_t staging = calib::joint::staging_at_once(groups, choice, schedule);
    if (bytes <= budget && bytes + staging <= bound) best = std::min(best, distortion);
    size_t g = 0;
    while (g < groups.size() && ++choice[g] == groups[g].options.size()) choice[g++] = 0;
    if (g == groups.size()) return best;
  }
}

// Options of one toy head (ladder 8, 40, 64, full; snap below the 160 tokens), the walk's window
// 64 at 0.1: snap at 40 slots is the head's best where `snap_helps`.
std::vector<calib::joint::HeadOption> head_options(bool snap_helps) {
  return {{KeepRule::kWindow, 8, 0.4},
          {KeepRule::kWindow, 40, 0.3},
          {KeepRule::kWindow, 64, 0.1},
          {KeepRule::kWindow, kFullWindow, 0.101},
          {KeepRule::kSnap, 8, snap_helps ? 0.2 : 0.4},
          {KeepRule::kSnap, 40, snap_helps ? 0.05 : 0.4},
          {KeepRule::kSnap, 64, snap_helps ? 0.0505 : 0.4}};
}

// Global layers 0..layers-1 of two heads each; snap helps head 0 of every layer and head 1 of
// layer 0 (so layer 0 stages more than the others).
std::vector<calib::joint::LayerOptions> layer_options(int64_t layers) {
  std::vector<calib::joint::LayerOptions> out;
  for (int64_t l = 0; l < layers; ++l)
    out.push_back({l, 0.1, {head_options(true), head_options(l == 0)}, 14});
  return out;
}

struct Policy {
  std::map<int64_t, std::vector<int64_t>> windows;
  std::map<int64_t, std::vector<KeepRule>> rules;
  double distortion = 0.0;
};

// Every policy the options can make (each head any option), with its summed measure in head order.
std::vector<Policy> every_policy(const std::vector<calib::joint::LayerOptions>& layers) {
  std::vector<std::pair<size_t, size_t>> heads;  // (layer index, head)
  for (size_t l = 0; l < layers.size(); ++l) {
    for (size_t h = 0; h < layers[l].heads.size(); ++h) heads.push_back({l, h});
  }
  std::vector<Policy> out;
  std::vector<size_t> choice(heads.size(), 0);
  for (;;) {
    Policy p;
    for (size_t i = 0; i < heads.size(); ++i) {
      const auto& [l, h] = heads[i];
      const auto& option = layers[l].heads[h][choice[i]];
      p.windows[layers[l].layer].push_back(option.level);
      p.rules[layers[l].layer].push_back(option.rule);
      p.distortion += option.divergence;
    }
    out.push_back(std::move(p));
    size_t i = 0;
    while (i < heads.size() && ++choice[i] == layers[heads[i].first].heads[heads[i].second].size())
      choice[i++] = 0;
    if (i == heads.size()) return out;
  }
}

std::set<int64_t> selecting(const std::map<int64_t, std::vector<KeepRule>>& rules) {
  std::set<int64_t> out;
  for (const auto& [layer, heads] : rules) {
    for (KeepRule rule : heads) {
      if (rule != KeepRule::kWindow) out.insert(layer);
    }
  }
  return out;
}

double measure_of(const calib::joint::Decision& d,
                  const std::vector<calib::joint::LayerOptions>& layers) {
  double sum = 0.0;
  for (size_t l = 0; l < layers.size(); ++l) {
    for (size_t h = 0; h < layers[l].heads.size(); ++h)
      sum += layers[l].heads[h][d.option[l][h]].divergence;
  }
  return sum;
}

}  // namespace

TEST_CASE("the bounded solve is exact in bytes and peak under both schedules (every choice tried)",
          "[calib][keep-rules]") {
  std::mt19937 random(7);
  const auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(random);
  };
  int64_t bounded = 0, infeasible = 0;
  for (int instance = 0; instance < 300; ++instance) {
    // Three layers of two heads, four options each; a layer's snap options stage its own amount.
    std::vector<StagedGroup> groups;
    for (int64_t layer = 0; layer < 3; ++layer) {
      const int64_t staging = uniform(5, 40);
      for (int head = 0; head < 2; ++head) {
        StagedGroup group{layer, {}};
        for (int k = 0; k < 4; ++k) {
          group.options.push_back({uniform(1, 30), uniform(0, 1) == 1 ? staging : 0,
                                   static_cast<double>(uniform(0, 1000)) / 997.0});
        }
        groups.push_back(std::move(group));
      }
    }
    const int64_t budget = uniform(20, 150);
    const int64_t bound = budget + uniform(0, 200);
    for (auto schedule : {PrefillSchedule::kWholePrompt, PrefillSchedule::kLayerByLayer}) {
      INFO("instance " << instance << " budget " << budget << " bound " << bound);
      const double expected = brute_force(groups, budget, bound, schedule);
      const auto got = calib::joint::solve_bounded(groups, budget, bound, schedule);
      if (!std::isfinite(expected)) {
        CHECK(!got);
        ++infeasible;
        continue;
      }
      REQUIRE(got);
      CHECK(got->distortion == expected);  // summed in the same order: the same double
      int64_t bytes = 0;
      for (size_t g = 0; g < groups.size(); ++g) bytes += groups[g].options[got->choice[g]].bytes;
      CHECK(bytes == got->bytes);
      CHECK(bytes <= budget);
      CHECK(got->staging == calib::joint::staging_at_once(groups, got->choice, schedule));
      CHECK(bytes + got->staging <= bound);
      // The bound mattered: the budget alone would have allowed less distortion.
      if (brute_force(groups, budget, std::numeric_limits<int64_t>::max() / 2, schedule) < expected)
        ++bounded;
    }
  }
  // The instances exercise the bound and infeasibility, not only the budget.
  CHECK(bounded > 50);
  CHECK(infeasible > 5);
}

TEST_CASE(
    "the joint solve keeps --prefill-peak exactly: at the policy's peak the same, one byte "
    "below another within it",
    "[calib][keep-rules]") {
  const auto spec = test::toy_spec(std::vector(2, std::vector<test::ToyHead>(2)));
  const auto memory = test::toy_memory_options(kPrompt);
  const std::map<int64_t, std::vector<int64_t>> walk{{0, {64, 64}}, {1, {64, 64}}};
  const int64_t fixed = memory::fixed_bytes(spec, memory);
  const int64_t budget = memory::estimate(spec, walk, memory).total_bytes;
  const auto layers = layer_options(2);
  const auto plain = calib::joint::solve(spec, layers, budget - fixed, memory, walk, {});
  // Without the bound: three snap heads, two of them in layer 0.
  REQUIRE((plain.rules.at(0) == std::vector{KeepRule::kSnap, KeepRule::kSnap}));
  REQUIRE(plain.rules.at(1)[0] == KeepRule::kSnap);
  const auto all = every_policy(layers);
  for (auto schedule : {PrefillSchedule::kWholePrompt, PrefillSchedule::kLayerByLayer}) {
    const bool whole = schedule == PrefillSchedule::kWholePrompt;
    INFO((whole ? "whole prompt" : "layer by layer"));
    const PeakBound unbounded{std::numeric_limits<int64_t>::max() / 4, schedule, kPrompt};
    const int64_t peak =
        calib::joint::policy_peak(spec, plain.windows, plain.rules, memory, unbounded);
    // The figure is memory::prefill_peak's for the schedule.
    const auto figures = memory::prefill_peak(spec, plain.windows, memory, selecting(plain.rules),
                                              {{0, 0}, {0, 1}, {1, 0}}, kPrompt);
    CHECK(peak == (whole ? figures.whole_prompt_peak_bytes : figures.layer_by_layer_peak_bytes));
    // At exactly the policy's peak: the same policy.
    const auto same = calib::joint::solve(spec, layers, budget - fixed, memory, walk, {},
                                          PeakBound{peak, schedule, kPrompt});
    CHECK(same.windows == plain.windows);
    CHECK((same.rules == plain.rules));
    // One byte below: another policy, within the budget and the bound, and the best of those.
    const PeakBound below{peak - 1, schedule, kPrompt};
    const auto bounded = calib::joint::solve(spec, layers, budget - fixed, memory, walk, {}, below);
    CHECK((bounded.rules != plain.rules || bounded.windows != plain.windows));
    CHECK(memory::estimate(spec, bounded.windows, memory, calib::joint::selecting_layers(bounded))
              .total_bytes <= budget);
    CHECK(calib::joint::policy_peak(spec, bounded.windows, bounded.rules, memory, below) <=
          peak - 1);
    double best = std::numeric_limits<double>::infinity();
    for (const Policy& p : all) {
      if (memory::estimate(spec, p.windows, memory, selecting(p.rules)).total_bytes <= budget &&
          calib::joint::policy_peak(spec, p.windows, p.rules, memory, below) <= peak - 1)
        best = std::min(best, p.distortion);
    }
    CHECK(measure_of(bounded, layers) == Approx(best).epsilon(1e-12));
  }
  // Layer by layer only layer 0's two snap heads stage at once: a bound between the two peaks
  // keeps the policy under that schedule and changes it under the whole prompt's.
  const PeakBound layer_peak{calib::joint::policy_peak(spec, plain.windows, plain.rules, memory,
                                                       {std::numeric_limits<int64_t>::max() / 4,
                                                        PrefillSchedule::kLayerByLayer, kPrompt}),
                             PrefillSchedule::kLayerByLayer, kPrompt};
  const PeakBound whole_at_layer_peak{layer_peak.bytes, PrefillSchedule::kWholePrompt, kPrompt};
  CHECK((calib::joint::solve(spec, layers, budget - fixed, memory, walk, {}, layer_peak).rules ==
         plain.rules));
  CHECK((calib::joint::solve(spec, layers, budget - fixed, memory, walk, {}, whole_at_layer_peak)
             .rules != plain.rules));
}

TEST_CASE("the leftover's upgrades keep --prefill-peak", "[calib][keep-rules]") {
  const auto spec = test::toy_spec({std::vector<test::ToyHead>(2)});
  const auto memory = test::toy_memory_options(kPrompt);
  const std::map<int64_t, std::vector<int64_t>> walk{{0, {64, 64}}};
  const int64_t fixed = memory::fixed_bytes(spec, memory);
  const std::vector<calib::joint::LayerOptions> layers{
      {0, 0.1, {head_options(true), head_options(false)}, 14}};
  // The upgrade (head 0 from snap 40 to snap 64, 0.0005 above: within the tolerance) adds slots,
  // so it raises the peak by its bytes; the budget has room for it.
  const std::map<int64_t, std::vector<int64_t>> upgraded{{0, {64, 64}}};
  const std::map<int64_t, std::vector<KeepRule>> rules{{0, {KeepRule::kSnap, KeepRule::kWindow}}};
  const int64_t budget = memory::estimate(spec, upgraded, memory, {0}).total_bytes;
  const PeakBound whole{1, PrefillSchedule::kWholePrompt, kPrompt};
  const int64_t peak = calib::joint::policy_peak(spec, upgraded, rules, memory, whole);
  const auto spend = [&](int64_t bound) {
    const PeakBound b{bound, PrefillSchedule::kWholePrompt, kPrompt};
    const auto solved = calib::joint::solve(spec, layers, budget - fixed, memory, walk, {}, b);
    REQUIRE(solved.windows.at(0) == std::vector<int64_t>{40, 64});
    REQUIRE((solved.rules.at(0) == rules.at(0)));
    const auto spent = calib::joint::spend_leftover(spec, layers, solved, {}, budget, memory, b);
    CHECK(calib::joint::policy_peak(spec, spent.windows, spent.rules, memory, b) <= bound);
    return spent.windows.at(0);
  };
  CHECK(spend(peak) == std::vector<int64_t>{64, 64});
  CHECK(spend(peak - 1) == std::vector<int64_t>{40, 64});
}

TEST_CASE("--prefill-peak below the walk's steady bytes is refused in one line",
          "[calib][keep-rules]") {
  const auto spec = test::toy_spec({std::vector<test::ToyHead>(2)});
  const std::map<int64_t, std::vector<int64_t>> walk{{0, {64, 64}}};
  calib::KeepRuleOptions o;
  o.memory = test::toy_memory_options(kPrompt);
  const int64_t steady = memory::estimate(spec, walk, o.memory).total_bytes;
  o.prefill_peak = steady;
  CHECK(calib::joint::peak_bound(spec, walk, o).bytes == steady);
  CHECK(calib::joint::peak_bound(spec, walk, o).prompt_tokens == kPrompt);
  o.prefill_peak = steady - 1;
  CHECK_THROWS_WITH(calib::joint::peak_bound(spec, walk, o),
                    Catch::Contains("--prefill-peak") &&
                        Catch::Contains(fmt::format("below the {} bytes the walk's", steady)));
  o.prefill_peak = 0;  // no bound
  CHECK(!calib::joint::peak_bound(spec, walk, o).active());
}

namespace {

calib::CalibrationRequest fixture_request(const std::string& keep_rules) {
  return {{"model", testing::fixture_dir("qwen3_next_tiny").string()},
          {"context", "512"},
          {"budget", "24k"},
          {"windows", "8,32,full"},
          {"seq_len", "96"},
          {"samples", "4"},
          {"seed", "3"},
          {"keep_rules", keep_rules}};
}

calib::CalibrationRequest with(calib::CalibrationRequest request,
                               const calib::CalibrationRequest& more) {
  for (const auto& [key, value] : more) request[key] = value;
  return request;
}

}  // namespace

TEST_CASE(
    "--prefill-peak is refused before the walk without snap, below --budget, and "
    "--prefill-schedule without it",
    "[calib][keep-rules]") {
  const auto out = std::filesystem::temp_directory_path() / "prefill-peak-refused.yaml";
  const auto refused = [&](const calib::CalibrationRequest& request) {
    try {
      calib::CalibrationJob job(calib::parse_calibration_options(request), out);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  const auto snap = fixture_request("window,h2o,snap");
  CHECK_THAT(refused(with(fixture_request("window,h2o"), {{"prefill_peak", "30k"}})),
             Catch::Contains("--prefill-peak bounds what snap heads stage during prefill, and "
                             "--keep-rules 'window,h2o' has none"));
  CHECK_THAT(refused(with(snap, {{"prefill_peak", "20k"}})),
             Catch::Contains("--prefill-peak 20480 is below --budget 24576"));
  CHECK_THAT(refused(with(snap, {{"prefill_schedule", "layer"}})),
             Catch::Contains("--prefill-schedule layer: only with --prefill-peak"));
  CHECK_THAT(refused(with(snap, {{"prefill_peak", "30k"}, {"prefill_schedule", "both"}})),
             Catch::Contains("--prefill-schedule: expected whole or layer, got 'both'"));
  CHECK_THROWS_WITH(calib::parse_calibration_options(with(snap, {{"prefill_peak", "0"}})),
                    Catch::Contains("--prefill-peak"));
  CHECK(!std::filesystem::exists(out));
}

TEST_CASE("--prefill-peak is refused up front on more global layers than the bounded solve tries",
          "[calib][keep-rules]") {
  // The bounded solve tries every set of selecting layers (joint::solve_by_selecting_sets); without
  // --prefill-peak the solve over the layers' frontiers has no such limit.
  calib::CalibrationOptions o = calib::parse_calibration_options(
      with(fixture_request("window,h2o,snap"), {{"prefill_peak", "30k"}}));
  const std::vector rules{policy::KeepRule::kH2O, policy::KeepRule::kSnap};
  const size_t limit = calib::joint::kMaxPeakBoundLayers;
  CHECK_NOTHROW(calib::check_prefill_peak(o, rules, limit));
  CHECK_THROWS_WITH(calib::check_prefill_peak(o, rules, limit + 1),
                    Catch::Contains("--prefill-peak: the bounded joint solve tries every set of "
                                    "selecting layers, and 13 global layers is over 12"));
  o.prefill_peak.reset();
  CHECK_NOTHROW(calib::check_prefill_peak(o, rules, 48));
}

TEST_CASE(
    "--prefill-peak and its schedule are hashed and recorded only when given, and a manifest "
    "entry replays them",
    "[calib][keep-rules]") {
  const auto snap = fixture_request("window,h2o,snap");
  const auto plain = calib::hashed_options(calib::parse_calibration_options(snap));
  CHECK(!plain.contains("prefill_peak"));
  CHECK(!plain.contains("prefill_schedule"));
  const auto bounded = calib::parse_calibration_options(
      with(snap, {{"prefill_peak", "30k"}, {"prefill_schedule", "layer"}}));
  const auto hashed = calib::hashed_options(bounded);
  CHECK(hashed.at("prefill_peak") == 30 * 1024);
  CHECK(hashed.at("prefill_schedule") == "layer");
  nlohmann::json recorded = nlohmann::json::object();
  calib::record_options(bounded, recorded);
  CHECK(recorded.at("prefill_peak") ==
        nlohmann::json{{"bound_bytes", 30 * 1024}, {"schedule", "layer"}});
  CHECK(calib::changed_options(plain, hashed) ==
        std::vector<std::string>{"--prefill-peak", "--prefill-schedule"});
  const auto manifest = regen::parse_manifest(
      "policies:\n"
      "  - {name: p, output: p.yaml, model: m, context: 512, budget: 24k, windows: '8,32,full',\n"
      "     seed: 3, keep_rules: 'window,h2o,snap', prefill_peak: 30k, prefill_schedule: layer}\n",
      "manifest.yaml", "");
  CHECK(manifest.entries.at(0).request.at("prefill_peak") == "30k");
  CHECK(manifest.entries.at(0).request.at("prefill_schedule") == "layer");

  // End to end: the policy records the bound and the report the peak (the fixture's heads stay
  // window and h2o here, so the peak is the steady bytes).
  const auto out = std::filesystem::temp_directory_path() / "prefill-peak.yaml";
  calib::CalibrationJob job(bounded, out);
  const auto outcome = job.run(calib::RunControl{});
  CHECK_THAT(outcome.policy_yaml, Catch::Contains("prefill_peak:"));
  CHECK(outcome.policy.calibration.at("prefill_peak") == recorded.at("prefill_peak"));
  REQUIRE(outcome.record.keep_rules);
  const auto& peak = outcome.record.keep_rules->prefill_peak;
  REQUIRE(peak);
  CHECK(peak->bound == 30 * 1024);
  CHECK(peak->schedule == "layer");
  CHECK(peak->prompt_tokens == 512);
  CHECK(peak->peak <= peak->bound);
  CHECK(peak->peak >= outcome.policy.memory.total_bytes);
  CHECK(calib::keep_rules_json(*outcome.record.keep_rules).at("prefill_peak").at("peak_bytes") ==
        peak->peak);
}
