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
//    options in that layer. Each layer's assignments under both regimes (selecting, paying the
//    bookkeeping; or windows only) are reduced to their exact Pareto frontier in (bytes, summed
//    distortion) by a DP over the heads, and one exact solve over the layers' frontiers
//    (solve::solve_exact, the walk's solver, distortions added over heads as the walk's curves are)
//    chooses every layer's regime and heads together: the least total, fewer selecting layers on an
//    exact tie. With --prefill-peak, every set of selecting layers is solved instead (2^G,
//    G <= 12). The walk's own decision is one of the feasible points, so the solve never predicts
//    worse than it. With --prefill-peak the solve also keeps the policy's prefill peak within the
//    bound, exactly (peak_bound.hpp); the walk's decision stages nothing, so it stays feasible.
// 3. Joint check and repair. Each head was measured with the others at the walk's windows, so
//    heads that hold the same thing each look free to move, and the solve moves them together
//    (tiny-qwen3-next-8k at 50%: layer 3 all snap, span TV 0.0086 against the walk's 0.0081).
//    Each layer the solve changed is measured as a whole (every head at its chosen rule and level
//    at once, against the layer at the walk's windows, in one batch, on step 1's stream); a layer
//    that measures worse keeps the walk's windows and rules, and the other layers are solved
//    again exactly with the bytes it leaves (solve::solve_completion; the walk's decision always
//    fits). Repeated until no layer the solve changed measures worse (at most G + 1 solves).
// 4. Spend what the measure cannot rank (spend_leftover). The solve spends a byte only where it
//    lowers the measured sum, so bytes can stay unspent while more slots would still help what the
//    calibration does not measure (follow-up questions, a chain's later hops). Those bytes go to
//    heads of the layers not kept at the walk's windows, one upgrade at a time: any option of the
//    head with more slots (a higher level under its rule, or a window at a level that fits), whose
//    measured value is within kSpendTolerance of the layer's measure at the walk's windows above
//    the head's solved value; the smallest such increase first (then layer, head, fewer bytes), the
//    policy's bytes recomputed exactly (bookkeeping included) before each step, and its prefill
//    peak too under --prefill-peak (an upgrade that would raise it over the bound is not taken).
// 5. Report. The layers run again under the chosen rules and levels (conditioned): each layer's
//    measure with the walk's windows and with its decision, and the end-to-end measure; per layer
//    the joint check's two values and whether it was repaired.
//
// Not covered: the additive model is the walk's (heads measured one at a time, the stream below at
// the walk's windows, not at the final decision); the exact measure (no span) is refused.
#include <functional>
#include <map>
#include <set>

#include "calib/rules/peak_bound.hpp"
#include "headwise/calib/keep_rules.hpp"

namespace headwise::calib {

struct KeepRuleContext;

namespace joint {

// One option of one head: its rule at a level, and the span measure with only this head moved.
struct HeadOption {
  policy::KeepRule rule;
  int64_t level = 0;
  double divergence = 0.0;
};

// A global layer's measured options, per KV head.
struct LayerOptions {
  int64_t layer = 0;
  double base = 0.0;  // every head at the walk's window
  std::vector<std::vector<HeadOption>> heads;
  int64_t evaluations = 0;  // candidates measured
};

// Every global layer's levels and rules.
struct Decision {
  std::map<int64_t, std::vector<int64_t>> windows;
  std::map<int64_t, std::vector<policy::KeepRule>> rules;
  std::vector<std::vector<size_t>> option;  // per layer, per head: its index in LayerOptions
};

// A layer's joint check: the chosen assignment and the walk's windows, measured together.
struct JointCheck {
  double chosen = 0.0;
  double walk = 0.0;
};

// The joint measure of `layers` (the layers `decision` changed), per layer.
using JointMeasure =
    std::function<std::map<int64_t, JointCheck>(const Decision&, const std::set<int64_t>& layers)>;

// Under --prefill-peak the solve tries every set of selecting layers one by one (the peak is a
// second bound that one exact solve over the layers' frontiers does not carry): 2^G solves, G at
// most this. Without it, one solve over every layer (no limit).
inline constexpr size_t kMaxPeakBoundLayers = 12;

// --prefill-peak on more global layers than kMaxPeakBoundLayers: a FieldError naming it. The job
// refuses it before any heavy work (input_checks.cpp); the joint pass checks again for its other
// callers.
void refuse_peak_bound_beyond_limit(size_t global_layers);

// An upgrade is spent when its measured value exceeds the head's solved one by at most this
// fraction of its layer's measure at the walk's windows (spend_leftover).
inline constexpr double kSpendTolerance = 0.02;

// The exact solve (step 2) with the layers in `kept` at `walk`'s windows and rules; `budget` is the
// global layers' bytes (the policy's less its fixed bytes); `peak`, when active, bounds the whole
// policy's prefill peak (fixed bytes included). Without a peak, one exact solve whose groups are
// the layers' Pareto-optimal assignments under both regimes (selecting or not); with one,
// solve_by_selecting_sets.
Decision solve(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers, int64_t budget,
               const memory::MemoryOptions& memory,
               const std::map<int64_t, std::vector<int64_t>>& walk, const std::set<int64_t>& kept,
               const PeakBound& peak = {});

// Step 2 by enumeration: for every set of selecting layers (at most kMaxPeakBoundLayers layers),
// the heads' options solved exactly, the least total kept, fewer selecting layers on a tie. What
// `solve` does under a peak bound; without one, the same optimum as `solve` (the tests compare).
Decision solve_by_selecting_sets(const arch::ModelSpec& spec,
                                 const std::vector<LayerOptions>& layers, int64_t budget,
                                 const memory::MemoryOptions& memory,
                                 const std::map<int64_t, std::vector<int64_t>>& walk,
                                 const std::set<int64_t>& kept, const PeakBound& peak = {});

// Steps 2 and 3: solve, check the changed layers with `measure`, keep the worse ones at the walk's
// windows and solve the rest again, until none measures worse. `checks` gets each layer's last
// check; `kept` the layers repaired.
Decision solve_and_repair(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers,
                          int64_t budget, const memory::MemoryOptions& memory,
                          const std::map<int64_t, std::vector<int64_t>>& walk,
                          const JointMeasure& measure, std::map<int64_t, JointCheck>& checks,
                          std::set<int64_t>& kept, const PeakBound& peak = {});

// Step 4: `decision` with the bytes it leaves of `budget` (the whole policy's, fixed bytes
// included) spent on upgrades the measure cannot tell from the solve's choice; layers in `kept`
// stay as they are. The result's bytes (memory::estimate, bookkeeping included) are within budget,
// and its prefill peak (policy_peak) within `peak` when that is active.
Decision spend_leftover(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers,
                        const Decision& decision, const std::set<int64_t>& kept, int64_t budget,
                        const memory::MemoryOptions& memory, const PeakBound& peak = {});

// The layers with a selecting head (a rule other than window), of `rules` or of `decision`.
std::set<int64_t> selecting_layers(const std::map<int64_t, std::vector<policy::KeepRule>>& rules);
std::set<int64_t> selecting_layers(const Decision& decision);

// The whole policy's bytes under `decision`: memory::estimate, its selecting layers' bookkeeping
// included (what the budget bounds).
int64_t decision_bytes(const arch::ModelSpec& spec, const Decision& decision,
                       const memory::MemoryOptions& memory);

}  // namespace joint

// Whether any of `rules` is offered at every level (KeepRuleMethod::offered_at_every_level).
bool offered_at_every_level(const std::vector<policy::KeepRule>& rules);

// choose_keep_rules' result when some rule in o.rules is offered at every level; `context` has
// the sequences' prompt end when a rule needs it.
KeepRuleResult choose_keep_rules_jointly(arch::DecoderModel& model,
                                         const std::vector<std::vector<int64_t>>& sequences,
                                         const std::map<int64_t, std::vector<int64_t>>& windows,
                                         const KeepRuleOptions& o, const KeepRuleContext& context);

}  // namespace headwise::calib
