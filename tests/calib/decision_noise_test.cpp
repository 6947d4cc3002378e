// Issue 59: the bootstrap over the calibration sequences that says how sure a layer's decision is
// (src/calib/noise/), checked against values computed another way.
#include <catch2/catch.hpp>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>

#include "../arch/fixture_reference.hpp"
#include "calib/noise/bootstrap.hpp"
#include "calib/noise/decision_noise.hpp"
#include "calib/noise/noise_json.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/core/window.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/report/calib_report.hpp"

using namespace headwise;
using calib::SequenceValues;

namespace {

// Two heads, levels {8, full} each: 8 costs 100 bytes, full 400.
std::vector<solve::Group> two_heads() {
  std::vector<solve::Group> groups;
  for (int64_t h = 0; h < 2; ++h) {
    groups.push_back({0, h, {{8, 100, 0.0}, {kFullWindow, 400, 0.0}}});
  }
  return groups;
}

// The replicate's pooled mean computed from the sequences drawn, each listed as often as drawn,
// every answer position's value one by one (sequence s's positions share sums[s] equally).
double expanded_mean(const SequenceValues& v, const std::vector<uint32_t>& weights) {
  std::vector<double> positions;
  for (size_t s = 0; s < weights.size(); ++s) {
    for (uint32_t k = 0; k < weights[s]; ++k) {
      for (int64_t a = 0; a < v.answers[s]; ++a)
        positions.push_back(v.sums[s] / static_cast<double>(v.answers[s]));
    }
  }
  double total = 0.0;
  for (double x : positions) total += x;
  return total / static_cast<double>(positions.size());
}

// A percentile by sorting and interpolating by hand (R's type 7).
double percentile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  const double position = q * static_cast<double>(x.size() - 1);
  const double below = std::floor(position);
  const auto i = static_cast<size_t>(below);
  if (i + 1 >= x.size()) return x.back();
  return x[i] * (1.0 - (position - below)) + x[i + 1] * (position - below);
}

}  // namespace

TEST_CASE("decision noise: bootstrap draws, pooled means and percentiles", "[calib]") {
  const auto weights = calib::noise::bootstrap_weights(8, 500, 42);
  REQUIRE(weights.size() == 500);
  std::vector<double> drawn(8, 0.0);
  for (const auto& w : weights) {
    REQUIRE(w.size() == 8);
    uint32_t total = 0;
    for (size_t s = 0; s < w.size(); ++s) {
      total += w[s];
      drawn[s] += w[s];
    }
    CHECK(total == 8);  // N draws with replacement
  }
  // Each sequence is drawn once per replicate on average (500 replicates: within 10%).
  for (double d : drawn) CHECK(d / 500.0 == Approx(1.0).margin(0.1));
  CHECK(calib::noise::bootstrap_weights(8, 500, 42) == weights);  // deterministic
  CHECK(calib::noise::bootstrap_weights(8, 500, 43) != weights);

  const SequenceValues v{{0.5, 3.0, 0.0, 1.2}, {2, 3, 1, 4}};
  CHECK(calib::noise::pooled_mean(v) == Approx((0.5 + 3.0 + 0.0 + 1.2) / 10.0));
  for (const auto& w : calib::noise::bootstrap_weights(4, 50, 7)) {
    CHECK(calib::noise::weighted_mean(v, w) == Approx(expanded_mean(v, w)).epsilon(1e-12));
  }
  CHECK(std::isnan(calib::noise::weighted_mean(v, {0, 0, 0, 0})));

  const std::vector<double> x{4.0, 1.0, 3.0, 2.0, 10.0};
  for (double q : {0.0, 0.025, 0.25, 0.5, 0.9, 0.975, 1.0})
    CHECK(calib::noise::quantile(x, q) == Approx(percentile(x, q)));
  CHECK(calib::noise::quantile({1.0, 2.0, 3.0, 4.0}, 0.25) == Approx(1.75));
  CHECK(std::isnan(calib::noise::quantile({}, 0.5)));

  // The seed depends on the sequences' tokens and on the layer.
  const std::vector<std::vector<int64_t>> a{{1, 2, 3}, {4, 5, 6}};
  const std::vector<std::vector<int64_t>> b{{1, 2, 3}, {4, 5, 7}};
  CHECK(calib::noise::decision_seed(a, 1) == calib::noise::decision_seed(a, 1));
  CHECK(calib::noise::decision_seed(a, 1) != calib::noise::decision_seed(a, 3));
  CHECK(calib::noise::decision_seed(a, 1) != calib::noise::decision_seed(b, 1));
}

TEST_CASE("decision noise: the runner-up, the gap's interval and separation, recomputed by hand",
          "[calib]") {
  const auto groups = two_heads();
  const int64_t allowance = 500;  // one head at full at most
  const double price = 1e-4;
  // Per-sequence sums (one answer position each: sums are the values).
  std::map<std::vector<size_t>, SequenceValues> values;
  const std::vector<int64_t> ones(6, 1);
  values[{0, 0}] = {{0.9, 0.8, 0.95, 0.85, 0.9, 0.7}, ones};
  values[{1, 0}] = {{0.1, 0.5, 0.05, 0.6, 0.2, 0.4}, ones};  // head 0 matters on some sequences
  values[{0, 1}] = {{0.5, 0.1, 0.6, 0.05, 0.4, 0.2}, ones};  // head 1 on the others
  values[{1, 1}] = {{0.0, 0.0, 0.0, 0.0, 0.0, 0.0}, ones};   // over the allowance
  std::map<std::vector<size_t>, double> measured;
  for (const auto& [levels, v] : values) measured[levels] = calib::noise::pooled_mean(v);

  calib::noise::DecisionCandidates in;
  in.layer_id = 3;
  in.measured = &measured;
  in.per_sequence = [&values](const std::vector<size_t>& levels) -> const SequenceValues* {
    const auto it = values.find(levels);
    return it == values.end() ? nullptr : &it->second;
  };
  in.groups = &groups;
  in.allowance = allowance;
  in.price = price;
  in.chosen = {1, 0};  // 0.3083 + 0.05 against {0,1}'s 0.3083 + 0.05: a near tie
  in.seed = 99;
  in.replicates = 400;
  const auto noise = calib::noise::decision_noise(in);
  REQUIRE(noise.has_value());
  CHECK(noise->layer_id == 3);
  CHECK(noise->windows == std::vector<int64_t>{kFullWindow, 8});
  CHECK(noise->alternatives == 2);  // {0,0} and {0,1}; {1,1} does not fit
  CHECK(noise->runner_up_windows == std::vector<int64_t>{8, kFullWindow});
  const auto objective = [&](const std::vector<size_t>& l) {
    int64_t bytes = 0;
    for (size_t h = 0; h < l.size(); ++h) bytes += groups[h].options[l[h]].bytes;
    return measured.at(l) + price * static_cast<double>(bytes);
  };
  CHECK(noise->gap == Approx(objective({0, 1}) - objective({1, 0})));
  CHECK(noise->value == measured.at({1, 0}));

  // The same replicates by hand: each replicate's means from the drawn sequences listed out.
  std::vector<double> chosen, gaps;
  int64_t positive = 0, best = 0;
  for (const auto& w : calib::noise::bootstrap_weights(6, 400, 99)) {
    const double c = expanded_mean(values[{1, 0}], w) + price * 500;
    const double r = expanded_mean(values[{0, 1}], w) + price * 500;
    const double z = expanded_mean(values[{0, 0}], w) + price * 200;
    chosen.push_back(c - price * 500);
    gaps.push_back(r - c);
    positive += r - c > 0 ? 1 : 0;
    best += (c <= r && c <= z) ? 1 : 0;
  }
  CHECK(noise->value_lower == Approx(percentile(chosen, 0.025)).epsilon(1e-9));
  CHECK(noise->value_upper == Approx(percentile(chosen, 0.975)).epsilon(1e-9));
  CHECK(noise->gap_lower == Approx(percentile(gaps, 0.025)).epsilon(1e-9));
  CHECK(noise->gap_upper == Approx(percentile(gaps, 0.975)).epsilon(1e-9));
  CHECK(noise->gap_positive_share == Approx(positive / 400.0));
  CHECK(noise->chosen_best_share == Approx(best / 400.0));
  double mean = 0.0, squares = 0.0;
  for (double g : gaps) mean += g / 400.0;
  for (double g : gaps) squares += (g - mean) * (g - mean);
  CHECK(noise->gap_sd == Approx(std::sqrt(squares / 399.0)).epsilon(1e-9));
  // Which head keeps full KV is a coin toss on these sequences: not separated.
  CHECK(noise->gap_lower < 0.0);
  CHECK(noise->gap_upper > 0.0);
  CHECK_FALSE(noise->separated);

  // A head that matters on every sequence: separated, whatever the draw.
  values[{0, 1}] = {{0.9, 0.95, 0.9, 0.85, 0.8, 0.9}, ones};
  measured[{0, 1}] = calib::noise::pooled_mean(values[{0, 1}]);
  const auto clear = calib::noise::decision_noise(in);
  REQUIRE(clear.has_value());
  CHECK(clear->separated);
  CHECK(clear->gap_lower > 0.0);
  CHECK(clear->gap_positive_share == 1.0);
  CHECK(clear->sequences_to_separate == 6.0);  // separated at the 6 it has

  // Without the chosen assignment's per-sequence values there is nothing to say.
  in.chosen = {1, 1};
  values.erase({1, 1});
  CHECK_FALSE(calib::noise::decision_noise(in).has_value());
}

TEST_CASE("decision noise: the span measure's per-sequence values are each sequence's own measure",
          "[calib]") {
  c10::InferenceMode inference;
  arch::ModelOptions options;
  options.attention_chunk = 16;
  auto model = arch::load_model(testing::fixture_dir("qwen3_next_tiny"), options);
  const auto& spec = model->spec();
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> token(0, spec.vocab_size - 1);
  std::vector<std::vector<int64_t>> seqs(3, std::vector<int64_t>(48));
  for (auto& s : seqs)
    for (auto& t : s) t = token(rng);
  const std::vector<std::vector<int64_t>> answers{{36, 40, 44}, {38, 46}, {40, 41, 42, 47}};
  calib::AnswerSpanOptions so;
  so.micro_batch = 2;  // two micro-batches: 2 + 1 sequences
  so.windows = {4, 8, kFullWindow};
  so.margin = 6;
  calib::AnswerSpan span(*model, seqs, answers, so);
  const int64_t layer = spec.global_layer_ids().front();
  const auto heads = static_cast<size_t>(spec.layer(layer).attention->num_kv_heads);
  const calib::SpanSite& site = span.reference_site(layer);
  std::vector<std::vector<int64_t>> assignments{std::vector<int64_t>(heads, 4),
                                                std::vector<int64_t>(heads, 8)};
  std::vector<calib::SpanOutputs> candidates;
  for (const auto& w : assignments) candidates.push_back(site.compose(w));
  std::vector<SequenceValues> per_sequence;
  const auto means = span.evaluate(site, candidates, "test", &per_sequence);
  CHECK(span.evaluate(site, candidates, "test") == means);  // the pooled means do not change
  REQUIRE(per_sequence.size() == assignments.size());
  for (size_t c = 0; c < assignments.size(); ++c) {
    REQUIRE(per_sequence[c].sums.size() == seqs.size());
    CHECK(per_sequence[c].answers == std::vector<int64_t>{3, 2, 4});
    CHECK(calib::noise::pooled_mean(per_sequence[c]) == Approx(means[c]).epsilon(1e-12));
    CHECK(means[c] > 0.0);
  }
  // Each sequence measured on its own (the same span: its first answer is the batch's earliest).
  for (size_t s = 0; s < seqs.size(); ++s) {
    INFO("sequence " << s);
    std::vector<std::vector<int64_t>> one{seqs[s]};
    std::vector<std::vector<int64_t>> own_answers{answers[s]};
    // The same span start as the batch's: position 36 scored too, measured alone and taken out.
    const bool added = own_answers[0].front() != 36;
    if (added) own_answers[0].insert(own_answers[0].begin(), 36);
    calib::AnswerSpan alone(*model, one, own_answers, so);
    calib::AnswerSpan first(*model, one, {{36}}, so);
    REQUIRE(alone.span_begin() == span.span_begin());
    REQUIRE(first.span_begin() == span.span_begin());
    for (size_t c = 0; c < assignments.size(); ++c) {
      const double with_36 =
          alone.evaluate(alone.reference_site(layer),
                         {alone.reference_site(layer).compose(assignments[c])}, "test")[0] *
          static_cast<double>(own_answers[0].size());
      const double at_36 =
          first.evaluate(first.reference_site(layer),
                         {first.reference_site(layer).compose(assignments[c])}, "test")[0];
      const double expected = added ? with_36 - at_36 : with_36;
      CHECK(per_sequence[c].sums[s] == Approx(expected).epsilon(1e-5).margin(1e-7));
    }
  }
}

namespace {

// One calibration of the qwen3_next_tiny fixture as the stable-decisions test runs it (8
// sequences, ladder 8,32,full, 20k, the default answer-tv-span and window,h2o keep rules).
calib::CalibrationOutcome calibrate_fixture(const std::string& decisions) {
  calib::CalibrationRequest request{{"model", testing::fixture_dir("qwen3_next_tiny").string()},
                                    {"context", "512"},
                                    {"budget", "20k"},
                                    {"windows", "8,32,full"},
                                    {"samples", "8"},
                                    {"seq_len", "96"},
                                    {"seed", "0"},
                                    {"decisions", decisions}};
  calib::CalibrationJob job(calib::parse_calibration_options(request),
                            std::filesystem::temp_directory_path() / "decision-noise.yaml");
  return job.run(calib::RunControl{});
}

// A report entry's gap fields agree with each other: the interval holds the point gap, separated
// is its lower bound above 0, the shares are shares, and a separated gap is positive in at least
// 97.5% of the replicates (its 2.5% quantile is above 0).
void check_gap_fields(const nlohmann::json& entry) {
  const double gap = entry.at("gap").get<double>();
  const double lower = entry.at("gap_interval")[0].get<double>();
  const double upper = entry.at("gap_interval")[1].get<double>();
  CHECK(lower <= gap);
  CHECK(gap <= upper);
  CHECK(entry.at("separated").get<bool>() == (lower > 0.0));
  for (const char* share : {"gap_positive_share", "chosen_best_share"}) {
    CHECK(entry.at(share).get<double>() >= 0.0);
    CHECK(entry.at(share).get<double>() <= 1.0);
  }
  if (entry.at("separated").get<bool>())
    CHECK(entry.at("gap_positive_share").get<double>() >= 0.975);
  if (gap > 0.0) CHECK(entry.at("sequences_to_separate").get<double>() >= 8.0);  // at least N
  const double value = entry.at("value").get<double>();
  CHECK(entry.at("value_interval")[0].get<double>() <= value);
  CHECK(value <= entry.at("value_interval")[1].get<double>());
}

}  // namespace

TEST_CASE("decision noise: the keep rules' decisions in the report, their chosen trial the pass's",
          "[calib][decision-noise]") {
  c10::InferenceMode inference;
  const calib::CalibrationOutcome outcome = calibrate_fixture("point");
  const nlohmann::json report = report::calibration_report(outcome);
  // The policy's end-to-end value is the keep-rule pass's, which ran its windows and rules.
  REQUIRE(outcome.record.keep_rules.has_value());
  CHECK(report["answer_kl"]["end_to_end_policy"].get<double>() ==
        outcome.record.keep_rules->divergence_final);
  REQUIRE(report.contains("decision_noise"));
  const nlohmann::json& noise = report["decision_noise"];
  REQUIRE(noise["layers"].size() == 2);  // the walk's entries stay where other tools read them
  REQUIRE(noise.contains("keep_rules"));
  const nlohmann::json& keep = noise["keep_rules"];
  CHECK(keep["sequences"] == 8);
  CHECK(keep["replicates"] == 2000);
  // Both global layers have evicting heads at 20k: each has a keep-rule decision.
  REQUIRE(keep["layers"].size() == 2);
  CHECK(keep["layers_decided"] == 2);
  int64_t separated = 0;
  for (const auto& entry : keep["layers"]) {
    const int64_t layer = entry["layer_id"].get<int64_t>();
    INFO("layer " << layer);
    check_gap_fields(entry);
    separated += entry["separated"].get<bool>() ? 1 : 0;
    // The chosen trial is the one the pass took: the policy's windows and rules, and the pass's
    // measured value.
    const auto& pass = outcome.record.keep_rules->layers;
    const auto it = std::find_if(pass.begin(), pass.end(), [&](const calib::KeepRuleLayer& l) {
      return l.layer_id == layer;
    });
    REQUIRE(it != pass.end());
    CHECK(entry["value"].get<double>() == it->divergence_chosen);
    const policy::LayerPolicy* served = nullptr;
    for (const auto& l : outcome.policy.per_layer_policies)
      if (l.layer_id == layer) served = &l;
    REQUIRE(served != nullptr);
    REQUIRE(served->kv_head_rules.size() == served->kv_head_windows.size());
    for (size_t h = 0; h < served->kv_head_windows.size(); ++h) {
      const int64_t w = served->kv_head_windows[h];
      CHECK(entry["kv_head_windows"][h] ==
            (w == kFullWindow ? nlohmann::json("full") : nlohmann::json(w)));
      CHECK(entry["kv_head_rules"][h] == policy::keep_rule_name(served->kv_head_rules[h]));
    }
    // Under point the pass takes the least measured trial: no other trial measured less.
    CHECK(entry["runner_up_value"].get<double>() >= entry["value"].get<double>());
    CHECK(entry["gap"].get<double>() >= 0.0);
    CHECK((entry["runner_up_rules"] != entry["kv_head_rules"] ||
           entry["runner_up_windows"] != entry["kv_head_windows"]));
  }
  CHECK(keep["layers_separated"] == separated);
  // The default policy does not carry it (every committed policy's bytes would change).
  CHECK_FALSE(outcome.policy.calibration.contains("decision_noise"));
  CHECK(outcome.policy_yaml.find("decision_noise") == std::string::npos);
}

TEST_CASE("decision noise: --decisions stable records how sure each decision is in the policy",
          "[calib][decision-noise]") {
  c10::InferenceMode inference;
  const calib::CalibrationOutcome outcome = calibrate_fixture("stable");
  const nlohmann::json report = report::calibration_report(outcome);
  const nlohmann::json& recorded = outcome.policy.calibration.at("decision_noise");
  CHECK(recorded["sequences"] == 8);
  CHECK(recorded["replicates"] == 2000);
  REQUIRE(recorded["layers"].size() == 2);
  // Per layer, the walk's and the keep rules' summaries are the report's entries' fields.
  const auto summary_of = [](const nlohmann::json& entry) {
    return nlohmann::json{{"separated", entry["separated"]},
                          {"gap", entry["gap"]},
                          {"gap_interval", entry["gap_interval"]},
                          {"sequences_to_separate", entry["sequences_to_separate"]}};
  };
  const nlohmann::json& noise = report["decision_noise"];
  for (const auto& [section, key] : {std::pair{&noise["layers"], "walk"},
                                     std::pair{&noise["keep_rules"]["layers"], "keep_rules"}}) {
    REQUIRE(section->size() == 2);
    for (const auto& entry : *section) {
      const std::string layer = std::to_string(entry["layer_id"].get<int64_t>());
      INFO(key << " layer " << layer);
      check_gap_fields(entry);
      CHECK(recorded["layers"][layer][key] == summary_of(entry));
    }
  }
  // The policy's readers take it back as written.
  const auto path = std::filesystem::temp_directory_path() / "decision-noise-stable.yaml";
  { std::ofstream(path) << outcome.policy_yaml; }
  const policy::Policy read = policy::read_policy(path);
  CHECK(read.calibration == outcome.policy.calibration);
  CHECK(policy::to_yaml(read) == outcome.policy_yaml);
  std::filesystem::remove(path);
}

TEST_CASE("decision noise: a gap the bootstrap does not separate, as the report and policy say it",
          "[calib][decision-noise]") {
  // The chosen trial is better on the pooled mean (0.2100 against 0.2175) but each is better on
  // half the sequences: not separated. A third trial is worse on every sequence.
  const std::vector<int64_t> ones(8, 1);
  const SequenceValues chosen{{0.30, 0.10, 0.32, 0.12, 0.31, 0.11, 0.29, 0.13}, ones};
  const SequenceValues runner{{0.12, 0.31, 0.13, 0.33, 0.10, 0.31, 0.14, 0.30}, ones};
  const SequenceValues worse{std::vector<double>(8, 0.5), ones};
  const calib::DecisionGap gap =
      calib::noise::decision_gap({{&chosen, calib::noise::pooled_mean(chosen)},
                                  {&worse, calib::noise::pooled_mean(worse)},
                                  {&runner, calib::noise::pooled_mean(runner)}},
                                 11);
  CHECK(calib::noise::runner_up({{&chosen, 0.21}, {&worse, 0.5}, {&runner, 0.2175}}) == 2);
  REQUIRE(gap.has_runner_up);
  CHECK(gap.alternatives == 2);
  CHECK(gap.runner_up_value == Approx(0.2175));
  CHECK(gap.gap == Approx(0.0075));
  CHECK(gap.gap_lower < 0.0);
  CHECK(gap.gap_upper > 0.0);
  CHECK_FALSE(gap.separated);
  CHECK(gap.gap_positive_share > 0.3);
  CHECK(gap.gap_positive_share < 0.975);
  CHECK(gap.sequences_to_separate > 8.0);

  calib::KeepRuleNoise keep;
  static_cast<calib::DecisionGap&>(keep) = gap;
  keep.layer_id = 5;
  keep.windows = {2000, 512};
  keep.rules = {policy::KeepRule::kH2O, policy::KeepRule::kH2O};
  keep.runner_up_windows = {2000, 512};
  keep.runner_up_rules = {policy::KeepRule::kH2O, policy::KeepRule::kWindow};
  calib::DecisionNoise walk;
  static_cast<calib::DecisionGap&>(walk) = gap;
  walk.layer_id = 5;
  walk.windows = {2048, kFullWindow};
  walk.runner_up_windows = {kFullWindow, 2048};
  const nlohmann::json report = calib::noise::decision_noise_json({walk}, {keep});
  // The walk's keys exactly as before the keep rules had any: other tools read them.
  std::set<std::string> keys;
  for (const auto& [key, _] : report.items()) keys.insert(key);
  CHECK(keys == std::set<std::string>{"method", "replicates", "sequences", "layers_separated",
                                      "layers_decided", "layers", "keep_rules"});
  keys.clear();
  for (const auto& [key, _] : report["layers"][0].items()) keys.insert(key);
  CHECK(keys == std::set<std::string>{"layer_id", "kv_head_windows", "price", "allowance_bytes",
                                      "value", "value_interval", "alternatives",
                                      "chosen_best_share", "separated", "runner_up_windows",
                                      "runner_up_value", "gap", "gap_interval",
                                      "gap_positive_share", "gap_sd", "sequences_to_separate"});
  CHECK(report["layers"][0]["runner_up_windows"] == nlohmann::json{"full", 2048});
  const nlohmann::json& entry = report["keep_rules"]["layers"][0];
  CHECK(report["keep_rules"]["layers_separated"] == 0);
  CHECK(report["keep_rules"]["layers_decided"] == 1);
  CHECK(entry["kv_head_rules"] == nlohmann::json{"h2o", "h2o"});
  CHECK(entry["runner_up_rules"] == nlohmann::json{"h2o", "window"});
  CHECK(entry["kv_head_windows"] == nlohmann::json{2000, 512});
  CHECK(entry["separated"] == false);
  CHECK(entry["gap"] == gap.gap);
  CHECK(entry["gap_interval"] == nlohmann::json{gap.gap_lower, gap.gap_upper});
  CHECK(entry["gap_positive_share"] == gap.gap_positive_share);
  CHECK(entry["sequences_to_separate"] == gap.sequences_to_separate);
  check_gap_fields(entry);

  const nlohmann::json summary = calib::noise::decision_noise_summary({walk}, {keep});
  const nlohmann::json expected{{"separated", false},
                                {"gap", gap.gap},
                                {"gap_interval", {gap.gap_lower, gap.gap_upper}},
                                {"sequences_to_separate", gap.sequences_to_separate}};
  CHECK(summary["layers"]["5"]["keep_rules"] == expected);
  CHECK(summary["layers"]["5"]["walk"] == expected);
  CHECK(calib::noise::decision_noise_summary({}, {}).empty());
  CHECK(calib::noise::decision_noise_json({}, {}).empty());
}
