#pragma once
// --prefill-peak in the joint keep-rule pass (joint_rules.hpp; docs/keep-rules.md, "Bounding the
// prefill peak"). A snap head stages the prompt until it chooses, so a policy with snap heads peaks
// above its steady bytes during prefill (memory/prefill_peak.hpp). With a bound, the pass's choice
// must keep both, exactly in bytes:
//   steady bytes                   <= the budget
//   steady bytes + staging at once <= the bound
// where one snap head of a layer stages B * P * (2 * head_dim * s + 4) bytes (P the calibration's
// context as the prompt, B the batch) and "at once" is the schedule's: every snap head's staging
// (whole prompt, headwise's runtime and HeadwiseCache) or the largest layer's (layer by layer, as
// kvpress runs). The staging adds up per head, so the bound is a second additive constraint of
// the exact solve (the largest layer's sum under the layer schedule); solve_bounded below solves
// both exactly.
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "headwise/calib/keep_rules.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/runtime/decoder.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib::joint {

// The bound on the policy's prefill peak: memory::prefill_peak's figure for `schedule` with
// `prompt_tokens` of prompt.
struct PeakBound {
  int64_t bytes = 0;  // 0: no bound
  runtime::PrefillSchedule schedule = runtime::PrefillSchedule::kWholePrompt;
  int64_t prompt_tokens = 0;
  bool active() const { return bytes > 0; }
};

// One option of one head: its steady bytes, the bytes it stages during prefill (0 unless snap),
// and its measure.
struct StagedOption {
  int64_t bytes = 0;
  int64_t staging = 0;
  double distortion = 0.0;
};

// One head's options; the heads of a layer are adjacent (the layer schedule sums over them).
struct StagedGroup {
  int64_t layer = 0;
  std::vector<StagedOption> options;
};

struct BoundedChoice {
  std::vector<size_t> choice;  // one option per group
  double distortion = 0.0;     // summed in group order, as solve::solve_exact sums
  int64_t bytes = 0;
  int64_t staging = 0;  // held at once under the schedule
};

// The exact solve's groups (solve::Group, one per head in layer order) with each option's staging:
// `snap[g][k]` says whether option k of group g is a snap head's.
std::vector<StagedGroup> staged_groups(const arch::ModelSpec& spec,
                                       const std::vector<solve::Group>& groups,
                                       const std::vector<std::vector<bool>>& snap,
                                       const memory::MemoryOptions& memory, const PeakBound& bound);

// The staging `choice` holds at once under `schedule`.
int64_t staging_at_once(const std::vector<StagedGroup>& groups, const std::vector<size_t>& choice,
                        runtime::PrefillSchedule schedule);

// Exact: the choice of least total distortion with bytes <= budget and bytes + staging at once <=
// bound (ties: fewer bytes, then less staging, then the first found). Only choices whose total is
// below `incumbent` are searched (a solve over several sets of selecting layers keeps the best).
// nullopt when none is. A dynamic programme over the heads whose states are (bytes, staging of
// the layers done, staging of the layer under way), each keeping the least distortion; InputError
// naming --prefill-peak past `max_states` states after one head.
std::optional<BoundedChoice> solve_bounded(
    const std::vector<StagedGroup>& groups, int64_t budget, int64_t bound,
    runtime::PrefillSchedule schedule, double incumbent = std::numeric_limits<double>::infinity(),
    size_t max_states = size_t{1} << 20);

// One set of selecting layers under the bound: solve_exact's `exact` choice (within `budget`) when
// its peak is within `bound` (it is then optimal under both), else solve_bounded's.
std::optional<BoundedChoice> keep_within_peak(const std::vector<StagedGroup>& groups,
                                              const solve::SolveResult& exact, int64_t budget,
                                              int64_t bound, runtime::PrefillSchedule schedule,
                                              double incumbent);

// The prefill peak of a policy with these windows and rules under the bound's schedule, as
// memory::prefill_peak states it (its steady bytes when no head is snap).
int64_t policy_peak(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                    const std::map<int64_t, std::vector<policy::KeepRule>>& rules,
                    const memory::MemoryOptions& memory, const PeakBound& bound);

// --prefill-peak's bound from the pass's options (none at 0), with the calibration's context as
// the prompt. The walk's decision stages nothing: a bound at or above its steady bytes leaves the
// solve that decision to fall back on; one below them is an InputError naming --prefill-peak.
PeakBound peak_bound(const arch::ModelSpec& spec, const memory::HeadWindows& walk,
                     const KeepRuleOptions& o);

// The chosen policy's peak under the bound, checked within it and logged: the report's record.
PrefillPeakBound checked_peak(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                              const std::map<int64_t, std::vector<policy::KeepRule>>& rules,
                              const memory::MemoryOptions& memory, const PeakBound& bound);

}  // namespace headwise::calib::joint
