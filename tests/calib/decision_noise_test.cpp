// Issue 59: the bootstrap over the calibration sequences that says how sure a layer's decision is
// (src/calib/noise/), checked against values computed another way.
#include <catch2/catch.hpp>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "../arch/fixture_reference.hpp"
#include "calib/noise/bootstrap.hpp"
#include "calib/noise/decision_noise.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/core/window.hpp"

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
