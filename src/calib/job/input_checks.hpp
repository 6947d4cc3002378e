#pragma once
// The calibration job's refusals (calibration_job.cpp): each checks its inputs before the heavy
// work they would spoil, and names the flag at fault in one line (core/error.hpp). Internal to
// src/calib/job, not an API.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/calib/extrapolation.hpp"
#include "headwise/calib/memory_plan.hpp"
#include "headwise/dist/collective.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/keep_rule.hpp"

namespace headwise::calib {

// Logs the plan, and refuses it when it exceeds what is available. `samples_field`: what sets the
// planned sequences (samples, or samples_cap under auto, whose largest round is planned before the
// first); `limited`: --memory-limit set what is available.
void refuse_if_it_cannot_fit(const MemoryPlan& plan, std::string_view samples_field, bool limited);

// Says which levels the sequences cannot tell from full KV (`blind`), and what the chosen rule
// does with them: refuse, or warn and apply it.
void refuse_unmeasured_levels(const std::vector<int64_t>& blind, int64_t seq_len,
                              Extrapolation rule);

// Ranks that were given other flags or files would measure different things and deadlock or,
// worse, agree on a policy nobody asked for.
void refuse_ranks_with_other_inputs(dist::Collective& world, const std::string& inputs_hash);

// Follow-ups are questions asked after a rule chose at the prompt's end: without such a rule
// nothing chooses there, and the option would silently measure nothing different.
void refuse_follow_ups_without_choice(const CalibrationOptions& o,
                                      const std::vector<policy::KeepRule>& rules);

// --prefill-peak bounds what snap heads stage before they choose (joint_rules.hpp). Refused before
// any heavy work: without snap there is nothing staged to bound (the policy's peak is its steady
// bytes, which --budget bounds), a bound below the budget would bound the steady bytes too, and a
// model with more global layers than the bounded solve enumerates (joint::kMaxPeakBoundLayers).
void check_prefill_peak(const CalibrationOptions& o, const std::vector<policy::KeepRule>& rules,
                        size_t global_layers);

// The measure's own options, and keep rules only with a measure that scores the answers.
void check_measure_options(const CalibrationOptions& o, bool selecting_rules);

// --samples auto reads each walked layer's decision noise, which only the span measures keep
// (per-sequence values); with another measure the rule would have nothing to read.
void check_samples(const CalibrationOptions& o);

// --needles: refused with a --calib file (its records have no needles) and where the built-in
// set's sequences cannot hold them. After seq_len is resolved.
void check_needles(const CalibrationOptions& o);

// Feasibility before any heavy work: `fixed` bytes plus the smallest level everywhere.
void refuse_budget_below_minimum(const arch::ModelSpec& spec, const memory::MemoryOptions& mem,
                                 int64_t fixed, const CalibrationOptions& o);

}  // namespace headwise::calib
