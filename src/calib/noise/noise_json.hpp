#pragma once
// How sure the decisions are (issue 59), as JSON: the report's `decision_noise` section (the walk's
// decisions and the keep rules') and the policy's summary of it under --decisions stable. One
// writer of DecisionGap's fields for both, so the report and the policy name them alike.
#include <nlohmann/json.hpp>

#include <vector>

#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/seqcalib.hpp"

namespace headwise::calib::noise {

// The report's decision_noise: `layers` (the walk's decisions, as before) and, when the keep rules
// have any, `keep_rules` (the same fields, each layer's chosen trial against its runner-up).
// Empty when neither has a decision with per-sequence values.
nlohmann::json decision_noise_json(const std::vector<DecisionNoise>& walk,
                                   const std::vector<KeepRuleNoise>& keep_rules);

// policy.calibration.decision_noise: per layer (keyed by its id), how sure the walk's and the keep
// rules' decisions are (separated, the gap and its interval, sequences_to_separate), and the
// bootstrap's sequences and replicates. Empty when neither has a decision.
nlohmann::json decision_noise_summary(const std::vector<DecisionNoise>& walk,
                                      const std::vector<KeepRuleNoise>& keep_rules);

}  // namespace headwise::calib::noise
