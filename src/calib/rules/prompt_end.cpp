// Where a calibration sequence's prompt ends (prompt_end.hpp).
#include "headwise/calib/prompt_end.hpp"

#include <algorithm>

#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib {

namespace {

// Where the run of consecutive positions that ends just before `end` starts.
size_t run_start(const std::vector<int64_t>& positions, size_t end) {
  size_t first = end - 1;
  while (first > 0 && positions[first - 1] + 1 == positions[first]) --first;
  return first;
}

}  // namespace

std::vector<std::vector<int64_t>> answers_after_prompt_end(
    const std::vector<std::vector<int64_t>>& answers, int64_t follow_ups) {
  if (follow_ups < 0)
    throw_input_error("keep rules: --follow-ups must be 0 or more, got {}", follow_ups);
  std::vector<std::vector<int64_t>> out;
  for (size_t s = 0; s < answers.size(); ++s) {
    const auto& positions = answers[s];
    if (positions.empty()) {
      throw_input_error(
          "keep rules: calibration sequence {} has no answer positions to find its "
          "prompt end from",
          s);
    }
    size_t first = positions.size();
    for (int64_t run = 0; run <= follow_ups; ++run) {
      if (first == 0) {
        throw_input_error(
            "keep rules: calibration sequence {} has {} run(s) of answer positions, fewer than "
            "the question and --follow-ups {} need ({})",
            s, run, follow_ups, follow_ups + 1);
      }
      first = run_start(positions, first);
    }
    out.emplace_back(positions.begin() + static_cast<std::ptrdiff_t>(first), positions.end());
  }
  return out;
}

int64_t shared_prompt_end(const std::vector<std::vector<int64_t>>& answers, int64_t follow_ups) {
  const auto after = answers_after_prompt_end(answers, follow_ups);
  HEADWISE_CHECK(!after.empty(), "prompt end of no sequences");
  const int64_t end = after.front().front();
  for (size_t s = 1; s < after.size(); ++s) {
    if (after[s].front() != end) {
      throw_input_error(
          "keep rule snap: the calibration sequences' prompts end at different positions "
          "(sequence 0 at {}, sequence {} at {}); snap is calibrated with one prompt end for all "
          "sequences, so give sequences of one shape",
          end, s, after[s].front());
    }
  }
  return end;
}

bool chooses_at_prompt_end(const std::vector<policy::KeepRule>& rules) {
  return std::any_of(rules.begin(), rules.end(), [](const policy::KeepRule& rule) {
    return rule != policy::KeepRule::kWindow && keep_rule_method(rule).chooses_at_prompt_end();
  });
}

int64_t rules_prompt_end(const std::vector<policy::KeepRule>& rules,
                         const std::vector<std::vector<int64_t>>& answers, int64_t follow_ups) {
  if (!chooses_at_prompt_end(rules)) return 0;
  const int64_t end = shared_prompt_end(answers, follow_ups);
  for (size_t s = 0; s < answers.size(); ++s) {
    if (answers[s].front() < end) {
      throw_input_error(
          "keep rule snap: calibration sequence {} scores answer position {} before its prompt end "
          "{}, where a snap head still attends like full KV",
          s, answers[s].front(), end);
    }
  }
  return end;
}

}  // namespace headwise::calib
