#pragma once
// Where a calibration sequence's prompt ends, for keep rules that choose there
// (KeepRuleMethod::chooses_at_prompt_end: snap). Before the prompt end such a head still holds the
// whole prompt and attends like full KV, so a measure that scored answer positions there would
// make the rule look free. With such a rule allowed, every trial of the run (the walk's windows
// and the keep rules alike) is measured on the answer positions after the prompt end only.
//
// The rule: a sequence's prompt ends at the first position of its LAST run of consecutive answer
// positions, and only that run is measured. The built-in set (tasks/synthetic.cpp) ends with up to
// 8 queries, each followed by its value: the answer positions of the last query (its separator
// and the value tokens it predicts) are measured, the earlier queries and their values are part
// of the prompt, as in eval's needle_single and needle_multikey prompts, and the prompt ends just
// before the last query's separator (the question's marker and key are observed; its separator is
// the first decoded position). A user calibration file's tail answers are one run: the prompt
// ends at the first answer position and the whole tail is measured.
//
// Follow-ups (`--follow-ups N`): a question asked after the snap heads chose (a chain's next hop,
// a user's next turn) names a needle the prompt's question did not, so only a head that kept it
// without the question answers it. With N follow-ups the prompt ends at the first of the LAST
// N + 1 runs, and all N + 1 are measured: the question in the prompt and N asked after it.
#include <cstdint>
#include <vector>

#include "headwise/policy/keep_rule.hpp"

namespace headwise::calib {

// Per sequence, its last 1 + follow_ups runs of consecutive answer positions (the ones after its
// prompt end). InputError naming the sequence when one has fewer runs, and for follow_ups < 0.
std::vector<std::vector<int64_t>> answers_after_prompt_end(
    const std::vector<std::vector<int64_t>>& answers, int64_t follow_ups = 0);

// The prompt end every sequence shares: the first of its answers_after_prompt_end. A rule that
// chooses at the prompt's end is run on a whole batch with one prompt end, so sequences whose
// prompt ends differ are an InputError naming the first two.
int64_t shared_prompt_end(const std::vector<std::vector<int64_t>>& answers, int64_t follow_ups = 0);

// Whether any of `rules` chooses at the prompt's end (KeepRuleMethod::chooses_at_prompt_end).
bool chooses_at_prompt_end(const std::vector<policy::KeepRule>& rules);

// The prompt end a pass with `rules` gives its rules: 0 when none chooses there; else the shared
// prompt end of `answers`, which must hold no position before it (an InputError: such a position
// would score a snap head while it still attends like full KV).
int64_t rules_prompt_end(const std::vector<policy::KeepRule>& rules,
                         const std::vector<std::vector<int64_t>>& answers, int64_t follow_ups = 0);

}  // namespace headwise::calib
