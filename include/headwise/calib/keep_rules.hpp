#pragma once
// Keep rules (`--keep-rules window,h2o`): after SeqCalib has decided every head's window, decide
// which heads fill their slots with tokens a rule selects (H2O's heavy hitters, or any rule that
// registers a method: keep_rule_method.hpp) instead of their most recent tokens.
//
// A window keeps what is near; heavy hitters keep what the head's queries have attended to most,
// wherever it is. Measured on the 8K default model at 4K and 50% of full KV (docs/seqcalib.md):
// windows everywhere 0.867 mean needle accuracy, H2O in every head 0.897, H2O in the first
// global layer's 512-token heads and windows in the last layer's 0.903. Neither rule wins
// everywhere, so each head's rule is measured, as its window is.
//
// The walk. Global layers in execution order, on the stream the layers below produce under
// their windows and the rules already chosen (with conditioning; full KV below without). For
// each head whose slots are fewer than the calibration sequence's tokens (others never evict,
// and their rule cannot be told apart), in head order, each allowed rule in turn (h2o below):
// switch it to h2o, pay for the layer's selection bookkeeping (memory::selection_bytes, counted
// in the policy's bytes) by taking slots from the layer's h2o heads when the budget has no room
// for it, run the layer through exactly the runtime's eviction code (runtime::simulate_eviction,
// chunked as the runtime prefills; the rule's method), and
// keep the switch when the answer divergence at the output (the policy's measure) goes down.
// One pass: each head tries each rule once, given the rules chosen before it. Under the span
// measure a layer with few candidates measures every assignment of rules to them in one batch
// and keeps the best.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/runtime/decoder.hpp"

namespace headwise::calib {

// The rules a head may take instead of its window, in registration order (policy::keep_rule_names):
// "window" gives none, "window,h2o" (or "h2o,window") h2o. Anything but a comma-separated list of
// registered rules that includes window is an InputError naming --keep-rules.
std::vector<policy::KeepRule> parse_keep_rules(const std::string& text);

// The rules a calibration uses, spelled as the policy records them: window, then the others in
// registration order ("window", "window,h2o"). "auto" (the default) is window,h2o under an answer
// measure, the configuration that wins on retrieval (docs/results.md), and window under
// block-mse, which cannot see what a rule costs the answers. A selecting rule with block-mse is an
// InputError naming --keep-rules.
std::string resolve_keep_rules(const std::string& text, DistortionMeasure measure);

struct KeepRuleOptions {
  // The rules a head may take instead of its window, each with a registered method
  // (keep_rule_method.hpp), in the order the pass tries them.
  std::vector<policy::KeepRule> rules = {policy::KeepRule::kH2O};
  memory::MemoryOptions memory;  // the policy's serving shape: slots and bookkeeping bytes
  int64_t budget_bytes = 0;      // the whole policy (fixed bytes included) must stay within it
  int64_t prefill_chunk = 256;   // the runtime's prefill chunk: H2O evicts after every chunk
  int64_t micro_batch = 1;
  ActivationPlacement activations = ActivationPlacement::kAuto;
  bool conditioned = true;  // false: every layer measured on the full-KV stream
  AnswerDivergence divergence = AnswerDivergence::kTv;
  // The answer-span measure (its reference done, on these sequences): trials run on the span, and
  // the sequences may be this rank's shard (its evaluations sum over every rank). nullptr: the
  // exact measure on every sequence.
  AnswerSpan* span = nullptr;
  // --decisions stable (issue 59; span measure, one process): a layer's rules are the trial with
  // every evicting head selecting, else every head at its window, whichever first measures within
  // noise::kStableRuleEffect of the least measured trial, else the least; false: the least
  // measured value.
  bool stable_decisions = false;
  // How sure each layer's decision is (issue 59; span measure): per-sequence values kept for every
  // trial and bootstrapped (KeepRuleResult::noise). Needs every sequence's values: one process.
  bool decision_noise = true;
  // --prefill-peak (joint_rules.hpp): the policy's prefill peak under `prefill_schedule`, the
  // memory's context as the prompt, stays within these bytes; 0: no bound.
  int64_t prefill_peak = 0;
  runtime::PrefillSchedule prefill_schedule = runtime::PrefillSchedule::kWholePrompt;
  // With snap: the answers hold the question's run and this many follow-ups' (prompt_end.hpp).
  int64_t follow_ups = 0;
};

// --prefill-peak in the report: the bound, its schedule, the prompt it assumes and the policy's
// peak under it.
struct PrefillPeakBound {
  int64_t bound = 0;
  std::string schedule;
  int64_t prompt_tokens = 0;
  int64_t peak = 0;
};

struct KeepRuleLayer {
  int64_t layer_id = 0;
  std::vector<int64_t> candidates;  // heads tried (their slots evict on the calibration data)
  double divergence_windows = 0.0;  // the measure with every head at its window
  double divergence_chosen = 0.0;   // with the rules chosen
  int64_t selection_bytes = 0;      // bookkeeping the layer now holds (0: no h2o head)
  int64_t slots_given_up = 0;       // slots the h2o heads gave to pay for it
  // The joint pass's check (joint_rules.hpp), on the stream at the walk's windows: the layer's
  // solved assignment measured as a whole and the walk's windows, and whether the layer was
  // repaired (kept at the walk's windows). Negative: not checked (the solve left it as it was).
  double joint_chosen = -1.0;
  double joint_walk = -1.0;
  bool repaired = false;
};

// How sure one layer's keep-rule decision is (issue 59): the bootstrap of DecisionGap over every
// trial the pass measured on the span. Every trial fits the budget and the pass compares their
// measured values alone, so J = D (no price). Chosen: the trial the pass took (the least D under
// --decisions point; the stable rule's choice under stable, whose gap may then be negative).
struct KeepRuleNoise : DecisionGap {
  int64_t layer_id = 0;
  std::vector<int64_t> windows;  // the chosen trial's, its selecting heads' slots paid for
  std::vector<policy::KeepRule> rules;
  std::vector<int64_t> runner_up_windows;  // empty when there is no other trial
  std::vector<policy::KeepRule> runner_up_rules;
};

struct KeepRuleResult {
  std::map<int64_t, std::vector<int64_t>> windows;         // the h2o heads' shrunk where they paid
  std::map<int64_t, std::vector<policy::KeepRule>> rules;  // per global layer, per KV head
  std::vector<KeepRuleLayer> layers;
  int64_t evaluations = 0;
  double seconds = 0.0;
  // The policy's end-to-end answer divergence (windows and rules) on the calibration sequences,
  // read off the pass's final stream; -1 when not measured (the exact measure's pass).
  double divergence_final = -1.0;
  std::optional<PrefillPeakBound> prefill_peak;  // with --prefill-peak
  std::vector<KeepRuleNoise> noise;  // per layer decided with per-sequence values, in layer order
};

// `windows`: SeqCalib's decision (global layers). `answers[s]`: the answer positions of sequence s.
KeepRuleResult choose_keep_rules(arch::DecoderModel& model,
                                 const std::vector<std::vector<int64_t>>& sequences,
                                 const std::vector<std::vector<int64_t>>& answers,
                                 const std::map<int64_t, std::vector<int64_t>>& windows,
                                 const KeepRuleOptions& options);

// The report's `keep_rules` section: per layer the heads tried, the measure before and after, the
// bookkeeping held and the slots given for it; the evaluations run and the seconds taken.
nlohmann::json keep_rules_json(const KeepRuleResult& result);

}  // namespace headwise::calib
