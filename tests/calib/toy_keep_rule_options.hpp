#pragma once
// The keep-rule pass's options for the toy model (toy_model.hpp): its serving shape, a budget of
// the windows' bytes plus `slack`, H2O's prefill chunk of 8, answer TV.
#include <cstdint>
#include <map>
#include <vector>

#include "headwise/calib/keep_rules.hpp"
#include "toy_model.hpp"

namespace headwise::test {

inline calib::KeepRuleOptions toy_keep_rule_options(
    const arch::ModelSpec& spec, const std::map<int64_t, std::vector<int64_t>>& windows,
    int64_t context, int64_t slack,
    std::vector<policy::KeepRule> rules = {policy::KeepRule::kH2O}) {
  calib::KeepRuleOptions o;
  o.rules = std::move(rules);
  o.memory = toy_memory_options(context);
  o.budget_bytes = memory::estimate(spec, windows, o.memory).total_bytes + slack;
  o.prefill_chunk = 8;
  o.divergence = calib::AnswerDivergence::kTv;
  return o;
}

}  // namespace headwise::test
