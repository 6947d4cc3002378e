#pragma once
// A global layer's keep-rule trials: which rule each head takes instead of its window, and the
// layer's attention under such a trial, as the runtime runs it (the keep-rule passes:
// keep_rules.cpp, joint_rules.cpp).
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/keep_rule.hpp"

namespace headwise::calib::trials {

// A trial of one layer: the rule of each head that does not keep its window.
using Trial = std::map<int64_t, policy::KeepRule>;

// The trial's heads grouped by the rule they take.
std::map<policy::KeepRule, std::set<int64_t>> heads_by_rule(const Trial& trial);

// The heads that take a rule (not their window).
std::set<int64_t> trial_heads(const Trial& trial);

// Heads [h*group, (h+1)*group) of `from` into `into` ([batch, tokens, heads, head_dim]).
void copy_head(at::Tensor& into, const at::Tensor& from, int64_t h, int64_t kv_heads);

// One global layer as the runtime runs it under `trial`: one run per rule the trial uses (each
// head's output depends only on its own keys, keep_rule_method.hpp), its heads composed; every
// head keeps its window when the trial is empty.
at::Tensor run_trial(const KeepRuleContext& context, const arch::AttentionInputs& in,
                     const std::vector<int64_t>& windows, const Trial& trial);

// One global layer under `trial`, every other layer exact.
class RuleCore final : public arch::AttentionCore {
 public:
  RuleCore(const KeepRuleContext& context, int64_t layer, const std::vector<int64_t>& windows,
           Trial trial)
      : context_(context),
        layer_(layer),
        windows_(windows),
        trial_(std::move(trial)),
        exact_(context.attention_chunk) {}

  at::Tensor attend(const arch::AttentionInputs& in) override;

 private:
  const KeepRuleContext& context_;
  int64_t layer_;
  std::vector<int64_t> windows_;
  Trial trial_;
  arch::ExactAttentionCore exact_;
};

// The answer-span measure's trials of one layer: each KV head's attention output at the span,
// from the site's window outputs or from its rule at the head's slots. A rule chooses each head's
// tokens from that head's own scores, so one run with every candidate head under a rule at a
// given window gives every candidate's output under it: a layer runs each rule once per distinct
// window its trials give that rule's heads, not once per trial.
class SpanTrials {
 public:
  SpanTrials(const KeepRuleContext& context, const SpanSite& site,
             const std::vector<int64_t>& candidates, const std::vector<int64_t>& base)
      : context_(context),
        site_(site),
        candidates_(candidates.begin(), candidates.end()),
        base_(base) {}

  // The layer's outputs at the span with `windows`, the heads of `trial` under their rules.
  SpanOutputs compose(const std::vector<int64_t>& windows, const Trial& trial);

 private:
  // Every candidate head's output at the span under `rule` with `window`'s slots.
  const SpanOutputs& under(const policy::KeepRule& rule, int64_t window);

  const KeepRuleContext& context_;
  const SpanSite& site_;
  std::set<int64_t> candidates_;
  std::vector<int64_t> base_;
  std::map<std::pair<policy::KeepRule, int64_t>, SpanOutputs> runs_;  // (rule, window) → outputs
};

// With the span measure, a layer whose trials (every assignment of its candidate heads to their
// window or an allowed rule) are at most this many measures them all in one batch; above it,
// each trial runs when the pass reaches it. 16: four candidates with h2o alone.
inline constexpr size_t kBatchedTrials = 16;

// `[512:h2o,2048]`: each head's window, and its rule where it takes one (the logs' label).
std::string rules_label(const std::vector<int64_t>& windows, const Trial& trial);

// Every trial of a layer's candidates, the empty one (every head at its window) first: each
// assignment of a candidate to its window or one of `rules`, candidate c as digit c of a number in
// base rules+1 (so with h2o alone, the sets of candidates in bit-mask order). Only the empty trial
// when there are more than kBatchedTrials.
std::vector<Trial> every_trial(const std::vector<int64_t>& candidates,
                               const std::vector<policy::KeepRule>& rules);

// The heads of layer `base` whose slots are fewer than the calibration tokens: only they evict,
// so only their rule can be told apart.
std::vector<int64_t> evicting_heads(const std::vector<int64_t>& base, int64_t tokens,
                                    const memory::MemoryOptions& memory);

// Each of `heads` heads' rule under `chosen` (window where it takes none).
std::vector<policy::KeepRule> rules_of(const Trial& chosen, size_t heads);

}  // namespace headwise::calib::trials
