// Issue 59: decisions that do not move with the calibration seed (--decisions stable,
// src/calib/noise/stable_choice.cpp).
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../arch/fixture_reference.hpp"
#include "calib/noise/stable_choice.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"

using namespace headwise;
using calib::SequenceValues;

namespace {

// One draw of 8 sequences: each candidate's divergence per sequence (one answer position each),
// candidate c's mean means[c] plus a sequence effect shared by every candidate (the sequence is
// easy or hard for all) and noise of its own.
std::vector<SequenceValues> draw(uint64_t seed, const std::vector<double>& means) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> sequence_effect(0.0, 0.05), own(0.0, 0.01);
  std::vector<SequenceValues> out(means.size());
  for (int s = 0; s < 8; ++s) {
    const double shared = sequence_effect(rng);
    for (size_t c = 0; c < means.size(); ++c) {
      out[c].sums.push_back(means[c] + shared + own(rng));
      out[c].answers.push_back(1);
    }
  }
  return out;
}

// The windows and keep rules of every global layer in a policy's text, in order.
std::string decisions_of(const std::string& policy_yaml) {
  std::istringstream in(policy_yaml);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.find("kv_head_windows") != std::string::npos ||
        line.find("kv_head_rules") != std::string::npos)
      out += line + "\n";
  }
  return out;
}

struct FixtureRun {
  std::string model;
  std::string context;
  std::string budget;
  std::string seq_len;  // empty: the context's
};

// The policy's decisions (windows and rules) of one calibration of a fixture with 8 sequences
// and the ladder 8,32,full; every other option at its default (answer-tv-span, window,h2o).
std::string calibrate(const FixtureRun& run, uint64_t seed, const std::string& decisions) {
  calib::CalibrationRequest request{{"model", testing::fixture_dir(run.model).string()},
                                    {"context", run.context},
                                    {"budget", run.budget},
                                    {"windows", "8,32,full"},
                                    {"samples", "8"},
                                    {"seed", std::to_string(seed)},
                                    {"decisions", decisions}};
  if (!run.seq_len.empty()) request["seq_len"] = run.seq_len;
  calib::CalibrationJob job(calib::parse_calibration_options(request),
                            std::filesystem::temp_directory_path() / "stable-decisions.yaml");
  return decisions_of(job.run(calib::RunControl{}).policy_yaml);
}

// The gemma3_gqa4 fixture (not in policies/manifest.yaml) at 256 tokens: the walk leaves both
// heads of its global layer at 8 tokens and the completion gives one of them 32; with the point
// decision, head 0 under seeds 0, 2, 3 and head 1 under seeds 1, 4.
const FixtureRun kGemma{"gemma3_gqa4", "256", "62k", ""};
// The qwen3_next_tiny fixture (not in the manifest) at 20k: two global layers of two heads, the
// keep rules and the re-solve; with the point decision both layers' windows and layer 3's rules
// move with the seed.
const FixtureRun kQwen{"qwen3_next_tiny", "512", "20k", "96"};

}  // namespace

TEST_CASE("stable choice: interchangeable candidates are decided by the order, under every draw",
          "[calib]") {
  // Candidate 0 (most preferred) is clearly worse; 1 and 2 have the same mean. Over 20 draws the
  // least value splits between 1 and 2; the stable rule takes 1 except where the test at 5%
  // separates two equal candidates (about one draw in 20), and never takes 0.
  const std::vector<double> means{0.30, 0.20, 0.20};
  std::vector<int> point(3, 0), stable(3, 0);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto values = draw(seed, means);
    std::vector<calib::noise::StableCandidate> candidates;
    for (const auto& v : values) candidates.push_back({&v, 0.0});
    const auto choice = calib::noise::stable_choice(candidates, seed);
    ++point[choice.best];
    ++stable[choice.chosen];
  }
  CHECK(point[0] == 0);
  CHECK(point[1] >= 5);
  CHECK(point[2] >= 5);
  CHECK(stable[0] == 0);
  CHECK(stable[1] >= 18);
}

TEST_CASE("stable choice: a penalty counts, and a candidate the data separate is not taken",
          "[calib]") {
  const auto values = draw(7, {0.20, 0.20});
  // The same values, the preferred one penalised far beyond the noise: the other is taken.
  const auto far = calib::noise::stable_choice({{&values[0], 0.5}, {&values[1], 0.0}}, 1);
  CHECK(far.chosen == 1);
  CHECK(far.separated_before == 1);
  // A penalty within the noise leaves the preferred one.
  const auto near = calib::noise::stable_choice({{&values[0], 0.001}, {&values[1], 0.0}}, 1);
  CHECK(near.chosen == 0);
  CHECK(calib::noise::t_quantile(1.959963984540054, 7.0) == Approx(2.365).margin(0.01));
  CHECK(calib::noise::t_quantile(1.959963984540054, 1e9) == Approx(1.96).margin(1e-3));
}

TEST_CASE("stable choice: a gap below the minimum effect is not separated", "[calib]") {
  // Candidate 0 worse by 0.06 on every sequence (the shared sequence effect cancels): the two
  // tests alone separate it; a minimum effect of 0.75 of the best's D (0.15) does not.
  const auto close = draw(3, {0.26, 0.20});
  const std::vector<calib::noise::StableCandidate> near{{&close[0]}, {&close[1]}};
  CHECK(calib::noise::stable_choice(near, 1).chosen == 1);
  CHECK(calib::noise::stable_choice(near, 1, calib::noise::kStableReplicates,
                                    calib::noise::kStableSwapEffect)
            .chosen == 0);
  // Worse by 0.30, beyond the minimum effect: separated either way.
  const auto apart = draw(3, {0.50, 0.20});
  const std::vector<calib::noise::StableCandidate> far{{&apart[0]}, {&apart[1]}};
  CHECK(calib::noise::stable_choice(far, 1, calib::noise::kStableReplicates,
                                    calib::noise::kStableSwapEffect)
            .chosen == 1);
  // A refinement (the re-solve) is kept for a gain of at least 10% of the value it replaces.
  CHECK(calib::noise::stable_refinement_kept(0.47, 0.36));
  CHECK_FALSE(calib::noise::stable_refinement_kept(0.34, 0.334));
  CHECK_FALSE(calib::noise::stable_refinement_kept(0.10, 0.10));
}

TEST_CASE("stable keep rules: a trial is worse by its effect alone, relative to the least",
          "[calib]") {
  using calib::noise::worse_by_effect;
  CHECK(worse_by_effect(0.2301, 0.20, calib::noise::kStableRuleEffect));
  CHECK_FALSE(worse_by_effect(0.229, 0.20, calib::noise::kStableRuleEffect));
  CHECK_FALSE(worse_by_effect(0.20, 0.20, 0.0));  // the least itself is never worse, even at 0
  CHECK_FALSE(worse_by_effect(0.0, 0.0, calib::noise::kStableRuleEffect));
  CHECK(worse_by_effect(1e-9, 0.0, calib::noise::kStableRuleEffect));
  CHECK(worse_by_effect(-0.8, -1.0, calib::noise::kStableRuleEffect));  // scaled by |least|
  CHECK_FALSE(worse_by_effect(-0.9, -1.0, calib::noise::kStableRuleEffect));
  CHECK_THROWS(worse_by_effect(0.3, 0.2, -0.1));
}

TEST_CASE("decisions stable: five seeds give one policy on fixtures not in the manifest",
          "[calib]") {
  for (const FixtureRun& run : {kGemma, kQwen}) {
    INFO(run.model);
    // The point decision moves with the seed here, so the check below can fail.
    const std::string point = calibrate(run, 0, "point");
    bool point_moved = false;
    for (uint64_t seed = 1; seed < 5 && !point_moved; ++seed)
      point_moved = calibrate(run, seed, "point") != point;
    CHECK(point_moved);
    const std::string first = calibrate(run, 0, "stable");
    REQUIRE(!first.empty());
    for (uint64_t seed = 1; seed < 5; ++seed) {
      INFO("seed " << seed);
      CHECK(calibrate(run, seed, "stable") == first);
    }
  }
}
