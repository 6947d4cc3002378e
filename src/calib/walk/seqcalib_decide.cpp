#include "calib/walk/seqcalib_decide.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "calib/noise/decision_noise.hpp"
#include "calib/noise/stable_choice.hpp"
#include "calib/walk/joint_descent.hpp"
#include "calib/walk/seqcalib_curves.hpp"
#include "calib/walk/shard_constraint.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib::seqcalib {
namespace {

std::vector<solve::Group> future_probe_groups(const RunState& state, int64_t layer_id) {
  std::vector<solve::Group> future;
  for (auto it = state.probe_groups.upper_bound(layer_id); it != state.probe_groups.end(); ++it) {
    append(future, it->second);
  }
  return future;
}

struct StableEntry {
  const std::vector<size_t>* levels;
  int64_t bytes;
  const SequenceValues* values;
  double j;  // the point objective D + λ·bytes
};

// The measured assignments within the allowance that have per-sequence values.
std::vector<StableEntry> stable_entries(const LevelMemo& memo, const JointLayerSource& source,
                                        const std::vector<solve::Group>& groups, int64_t allowance,
                                        double lambda) {
  std::vector<StableEntry> out;
  for (const auto& [levels, d] : memo) {
    if (levels.size() != groups.size()) continue;
    const int64_t bytes = layer_bytes(groups, levels);
    const SequenceValues* values = source.per_sequence(levels);
    if (bytes <= allowance && values != nullptr)
      out.push_back({&levels, bytes, values, d + lambda * static_cast<double>(bytes)});
  }
  return out;
}

// --decisions stable (issue 59). The point decision settles how many bytes the layer keeps (the
// least J = D + λ·bytes among the measured assignments within the allowance: the descent's
// choice, which the seeds agree on far more than on the rest). Which head keeps which level is
// then decided among the assignments of those bytes in a fixed order (the lower head keeping the
// longer window), the first that the data do not separate from the least J
// (noise/stable_choice.hpp, with the minimum effect kStableSwapEffect). Why not every assignment
// within the allowance, more bytes first (the rule before): in the last global layer (λ = 0) the
// assignment with the most bytes put a head at 128 tokens beside one at full KV ([full,128,2048,
// 512] on the 8K default model at 25%: D 0.55 against the least 0.37) and was inside the minimum
// effect; bytes are what the data rank, heads are what they cannot. `assign` when the measure
// keeps no per-sequence values.
std::vector<size_t> stable_assignment(const RunInputs& in, int64_t layer_id, const LevelMemo& memo,
                                      const JointLayerSource& source,
                                      const std::vector<solve::Group>& groups, int64_t allowance,
                                      double price, const std::vector<size_t>& assign,
                                      const JointPrefetch& prefetch) {
  if (!source.per_sequence || in.world.world_size() != 1) return assign;
  if (source.per_sequence(assign) == nullptr) return assign;
  const double lambda = std::isfinite(price) ? price : 0.0;
  const auto least = [](const std::vector<StableEntry>& entries) {
    return *std::min_element(entries.begin(), entries.end(),
                             [](const StableEntry& a, const StableEntry& b) { return a.j < b.j; });
  };
  // Which head gets which level must not depend on the descent's path: every permutation of the
  // least J's levels is measured (one batch), as the order may take any of them.
  if (prefetch) prefetch(distinct_orderings(assign));
  std::vector<StableEntry> entries = stable_entries(memo, source, groups, allowance, lambda);
  if (entries.empty()) return assign;
  std::vector<size_t> best_levels = *least(entries).levels;
  if (prefetch && best_levels != assign) {
    prefetch(distinct_orderings(best_levels));
    entries = stable_entries(memo, source, groups, allowance, lambda);
    best_levels = *least(entries).levels;
  }
  const int64_t bytes = layer_bytes(groups, best_levels);
  std::erase_if(entries, [bytes](const StableEntry& e) { return e.bytes != bytes; });
  std::stable_sort(entries.begin(), entries.end(), [](const StableEntry& a, const StableEntry& b) {
    return *a.levels > *b.levels;
  });
  std::vector<noise::StableCandidate> candidates;
  for (const auto& e : entries)
    candidates.push_back({e.values, lambda * static_cast<double>(e.bytes)});
  const auto choice = noise::stable_choice(candidates, noise::decision_seed(in.sequences, layer_id),
                                           noise::kStableReplicates, noise::kStableSwapEffect);
  const std::vector<size_t>& chosen = *entries[choice.chosen].levels;
  spdlog::info(
      "layer {}: stable decision [{}] ({} of {} assignments of its bytes preferred to it were "
      "separated; least J [{}], the descent's [{}])",
      layer_id, in.labels_of(chosen), choice.separated_before, entries.size(),
      in.labels_of(*entries[choice.best].levels), in.labels_of(assign));
  return chosen;
}

}  // namespace

int64_t price_layer(const RunInputs& in, const RunState& state, const Decisions& walked,
                    int64_t layer_id, const std::vector<solve::Group>& groups,
                    LayerReport& report) {
  const std::vector<solve::Group> future = future_probe_groups(state, layer_id);
  const int64_t remaining = in.options.global_budget_bytes - walked.spent;
  std::vector<solve::Group> combined = groups;
  append(combined, future);
  report.lambda = solve::min_fitting_lambda(combined, remaining);
  report.planned_ahead = future.empty() ? 0 : solve::relax_at(future, report.lambda).total_bytes;
  return remaining - report.planned_ahead;
}

LayerDecision layer_decision(const RunInputs& in, const Decisions& walked,
                             const std::vector<solve::Group>& groups,
                             const std::vector<size_t>& choice, LayerReport& report) {
  LayerDecision decision{groups, choice, {}, 0, std::nullopt};
  for (size_t h = 0; h < groups.size(); ++h) {
    const auto& option = groups[h].options[choice[h]];
    decision.windows.push_back(option.window);
    decision.bytes += option.bytes;
  }
  report.bytes_spent += decision.bytes;
  HEADWISE_CHECK(
      walked.spent + report.bytes_spent + report.planned_ahead <= in.options.global_budget_bytes,
      "controller overspent at layer {}", report.layer_id);
  return decision;
}

LayerDecision unconditioned_decision(const RunInputs& in, const RunState& state,
                                     const Decisions& walked, int64_t layer_id,
                                     LayerReport& report) {
  return layer_decision(in, walked, state.probe_groups.at(layer_id),
                        state.unconditioned_plan.at(layer_id), report);
}

void plan_unconditioned(const RunInputs& in, RunState& state) {
  std::vector<solve::Group> all;
  for (const auto& [id, groups] : state.probe_groups) append(all, groups);
  const auto solution = solve_within_shards(in, all, in.options.global_budget_bytes);
  for (size_t g = 0; g < all.size(); ++g) {
    state.unconditioned_plan[all[g].layer_id].push_back(solution.choice[g]);
  }
}

// answer-kl: the heads of a layer are decided together, because they back each other up: a
// head that looks free to cut while the others keep the needle may be the last one holding it
// once they are cut. The controller gives the layer its bytes as for block-mse (its curves
// measured with the other heads at the top level, the layers above priced by the probe).
// Within them, a greedy descent on the *joint* answer KL: from every head at the top level,
// take the cut with the least KL added per byte saved, measured with the other heads at their
// current windows, until the layer fits; keep cutting while a cut adds less KL per byte than
// the controller's price λ (those bytes are worth more in the layers above); then lengthen
// within the allowance only where a lengthening removes more than λ per byte. Each step is
// conditioned on the steps before, as SeqCalib conditions each layer on the layers below.
// Without the price, the relaxed allowance was spent in full on the first global layer and
// left the last one short (in-sample answer KL 3.95 against 2.38 with it, default model, 25%).
LayerDecision decide_jointly(const RunInputs& in, RunState& state, const Decisions& walked,
                             int64_t layer_id, const JointLayerSource& source,
                             LayerReport& report) {
  if (!in.options.conditioned) return unconditioned_decision(in, state, walked, layer_id, report);
  LevelMemo memo;
  if (source.seed) source.seed(memo);
  const size_t known = memo.size();  // assignments measured before this layer's walk
  const LayerMeasure layer_cost = source.measure(memo);
  const auto& measured = layer_cost.measure;
  const auto& prefetch = layer_cost.prefetch;
  const auto& layer = in.spec.layer(layer_id);
  const auto heads = static_cast<size_t>(layer.attention->num_kv_heads);
  std::vector<size_t> assign(heads, in.options.ladder.size() - 1);
  std::vector<solve::Group> groups = marginal_groups(in, layer_id, assign, measured, prefetch);
  const auto joint = with_extrapolated_levels(in.options, measured, groups);
  const int64_t allowance = price_layer(in, state, walked, layer_id, groups, report);
  if (in.options.joint_heads) {
    assign = greedy_joint_descent(groups, allowance, joint, report.lambda, prefetch);
    if (source.improve) source.improve(groups, allowance, assign, joint);
    if (in.options.stable_decisions) {
      assign = stable_assignment(in, layer_id, memo, source, groups, allowance, report.lambda,
                                 assign, prefetch);
    }
    if (constrained_to_shards(in)) {
      assign = shard_joint_choice(in, layer_id, groups, allowance, report.lambda, assign, joint,
                                  prefetch);
    }
    groups = marginal_groups(in, layer_id, assign, joint, prefetch);
  } else {
    assign = solve_within_shards(in, groups, allowance).choice;
  }
  state.answer_evaluations += static_cast<int64_t>(memo.size() - known);
  spdlog::debug("layer {}: windows [{}], joint {} {:.6g} ({} evaluations)", layer_id,
                in.labels_of(assign), in.measured_label(), joint(assign), memo.size() - known);
  if (source.validate) source.validate(assign, joint, groups, allowance, report.lambda);
  LayerDecision decision = layer_decision(in, walked, groups, assign, report);
  if (source.per_sequence && in.world.world_size() == 1) {
    noise::DecisionCandidates candidates;
    candidates.layer_id = layer_id;
    candidates.measured = &memo;
    candidates.per_sequence = source.per_sequence;
    candidates.groups = &groups;
    candidates.allowance = allowance;
    candidates.price = report.lambda;
    candidates.chosen = assign;
    candidates.seed = noise::decision_seed(in.sequences, layer_id);
    decision.noise = noise::decision_noise(candidates);
  }
  return decision;
}

}  // namespace headwise::calib::seqcalib
