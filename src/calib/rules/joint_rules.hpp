#pragma once
// The keep-rule pass when an allowed rule is offered at every ladder level
// (KeepRuleMethod::offered_at_every_level: snap). A snap head answers from the keys the question
// picks, so it needs far fewer slots than a window head; choosing it at the walk's window would
// waste the budget. Instead every head's rule and level are chosen together, across the layers,
// with one exact solve:
//
// 1. Measure (the span measure). Global layers in execution order, the stream conditioned on the
//    walk's windows below (every head at its window; full KV below without conditioning). At each
//    layer, every KV head on its own, the others at the walk's windows: the head at every ladder
//    level keeping its most recent tokens, and under every allowed selecting rule at every ladder
//    level whose slots are fewer than the calibration tokens (more never evict). One run of the
//    layer per (rule, level) gives every head's output (keep_rule_method.hpp), and the layer's
//    options are measured in one batch.
// 2. Solve. A head's option costs its slots' bytes (memory::head_bytes); a layer with any
//    selecting head also holds the bookkeeping of memory::selection_bytes (12 B per slot of every
//    head of the layer, 24 B per head, times batch), which is split exactly into each head's
//    options in that layer. For every set of selecting layers (2^G of G global layers, G <= 12)
//    the heads' options are solved exactly (solve::solve_exact, the walk's solver, distortions
//    added over heads as the walk's curves are); the least total wins, fewer selecting layers on a
//    tie. The walk's own decision is one of the feasible points, so the solve never predicts
//    worse than it.
// 3. Report. The layers run again under the chosen rules and levels (conditioned): each layer's
//    measure with the walk's windows and with its decision, and the end-to-end measure.
//
// Not covered: the additive model is the walk's (heads measured one at a time, the stream below at
// the walk's windows, not at the final decision); the exact measure (no span) is refused.
#include "headwise/calib/keep_rules.hpp"

namespace headwise::calib {

struct KeepRuleContext;

// Whether any of `rules` is offered at every level (KeepRuleMethod::offered_at_every_level).
bool offered_at_every_level(const std::vector<policy::KeepRule>& rules);

// choose_keep_rules' result when some rule in o.rules is offered at every level; `context` has
// the sequences' prompt end when a rule needs it.
KeepRuleResult choose_keep_rules_jointly(arch::DecoderModel& model,
                                         const std::vector<std::vector<int64_t>>& sequences,
                                         const std::map<int64_t, std::vector<int64_t>>& windows,
                                         const KeepRuleOptions& o, const KeepRuleContext& context);

}  // namespace headwise::calib
