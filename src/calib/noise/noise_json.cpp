#include "calib/noise/noise_json.hpp"

#include <cmath>
#include <string>

#include "headwise/core/window.hpp"

namespace headwise::calib::noise {
namespace {

constexpr const char* kWalkMethod =
    "bootstrap over the calibration sequences of the walk's decision (before the completion and "
    "any re-solve); objective J = value + price * bytes; runner-up: the other measured assignment "
    "within the layer's allowance with the least J; gap = J(runner-up) - J(chosen); intervals: 95% "
    "percentile; separated: the gap's lower bound above 0";
constexpr const char* kKeepRulesMethod =
    "bootstrap over the calibration sequences of the keep-rule pass's decision: every trial the "
    "layer measured on the answer span (each evicting head at its window or a rule, the selecting "
    "heads' slots paid for); objective J = value (every trial fits the budget); chosen: the trial "
    "the pass took; runner-up: the other trial with the least J; gap = J(runner-up) - J(chosen); "
    "intervals: 95% percentile; separated: the gap's lower bound above 0";

nlohmann::json finite(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

nlohmann::json windows_json(const std::vector<int64_t>& windows) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t w : windows)
    out.push_back(w == kFullWindow ? nlohmann::json("full") : nlohmann::json(w));
  return out;
}

nlohmann::json rules_json(const std::vector<policy::KeepRule>& rules) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& rule : rules) out.push_back(policy::keep_rule_name(rule));
  return out;
}

// What the policy's summary says of a decision: separated, and against a runner-up the gap, its
// interval and the sequences a normal approximation says would separate it.
nlohmann::json gap_summary_json(const DecisionGap& n) {
  nlohmann::json out{{"separated", n.separated}};
  if (n.has_runner_up) {
    out["gap"] = n.gap;
    out["gap_interval"] = nlohmann::json::array({finite(n.gap_lower), finite(n.gap_upper)});
    out["sequences_to_separate"] = finite(n.sequences_to_separate);
  }
  return out;
}

// What the report says of a decision: the summary, the chosen value with its interval, and the
// replicates' shares.
nlohmann::json gap_json(const DecisionGap& n) {
  nlohmann::json out = gap_summary_json(n);
  out["value"] = n.value;
  out["value_interval"] = nlohmann::json::array({finite(n.value_lower), finite(n.value_upper)});
  out["alternatives"] = n.alternatives;
  out["chosen_best_share"] = finite(n.chosen_best_share);
  if (n.has_runner_up) {
    out["runner_up_value"] = n.runner_up_value;
    out["gap_positive_share"] = finite(n.gap_positive_share);
    out["gap_sd"] = finite(n.gap_sd);
  }
  return out;
}

nlohmann::json walk_keys(const DecisionNoise& n) {
  nlohmann::json out{{"layer_id", n.layer_id},
                     {"kv_head_windows", windows_json(n.windows)},
                     {"price", n.price},
                     {"allowance_bytes", n.allowance}};
  if (n.has_runner_up) out["runner_up_windows"] = windows_json(n.runner_up_windows);
  return out;
}

nlohmann::json keep_rule_keys(const KeepRuleNoise& n) {
  nlohmann::json out{{"layer_id", n.layer_id},
                     {"kv_head_windows", windows_json(n.windows)},
                     {"kv_head_rules", rules_json(n.rules)}};
  if (n.has_runner_up) {
    out["runner_up_windows"] = windows_json(n.runner_up_windows);
    out["runner_up_rules"] = rules_json(n.runner_up_rules);
  }
  return out;
}

// One kind of decision's section: an entry per layer (DecisionGap's fields and `own` keys) and a
// summary.
template <class Noise, class Own>
nlohmann::json section(const char* method, const std::vector<Noise>& noise, Own own) {
  nlohmann::json layers = nlohmann::json::array();
  int64_t separated = 0;
  for (const auto& n : noise) {
    separated += n.separated ? 1 : 0;
    nlohmann::json entry = gap_json(n);
    entry.update(own(n));
    layers.push_back(std::move(entry));
  }
  return {{"method", method},
          {"replicates", noise.empty() ? 0 : noise.front().replicates},
          {"sequences", noise.empty() ? 0 : noise.front().sequences},
          {"layers_separated", separated},
          {"layers_decided", static_cast<int64_t>(noise.size())},
          {"layers", layers}};
}

}  // namespace

nlohmann::json decision_noise_json(const std::vector<DecisionNoise>& walk,
                                   const std::vector<KeepRuleNoise>& keep_rules) {
  // The walk's keys at the top, as before the keep rules had any: other tools read them there.
  nlohmann::json out =
      walk.empty() ? nlohmann::json::object() : section(kWalkMethod, walk, walk_keys);
  if (!keep_rules.empty())
    out["keep_rules"] = section(kKeepRulesMethod, keep_rules, keep_rule_keys);
  return out;
}

nlohmann::json decision_noise_summary(const std::vector<DecisionNoise>& walk,
                                      const std::vector<KeepRuleNoise>& keep_rules) {
  // Keyed by layer id, so that the policy shows each layer as a block of its own.
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& n : walk) layers[std::to_string(n.layer_id)]["walk"] = gap_summary_json(n);
  for (const auto& n : keep_rules)
    layers[std::to_string(n.layer_id)]["keep_rules"] = gap_summary_json(n);
  if (layers.empty()) return layers;
  const DecisionGap& any = walk.empty() ? static_cast<const DecisionGap&>(keep_rules.front())
                                        : static_cast<const DecisionGap&>(walk.front());
  return {{"replicates", any.replicates}, {"sequences", any.sequences}, {"layers", layers}};
}

}  // namespace headwise::calib::noise
