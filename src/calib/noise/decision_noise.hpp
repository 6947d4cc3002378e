#pragma once
// How sure a decision among measured candidates is (DecisionGap, headwise/calib/seqcalib.hpp): the
// bootstrap of bootstrap.hpp over the candidates the decision measured. decision_gap serves any
// decision (the walk's, the keep rules'); decision_noise gathers a walked layer's candidates.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "calib/noise/bootstrap.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib::noise {

inline constexpr size_t kDecisionReplicates = 2000;

// One measured candidate of a decision: its per-sequence values (never nullptr), its measured value
// D and what its objective J = D + penalty adds (λ·bytes, or 0).
struct Contender {
  const SequenceValues* values = nullptr;
  double value = 0.0;
  double penalty = 0.0;
};

// The runner-up among `contenders` (the chosen one first): the index of the least J among the
// others (ties: the first); 0 when there is no other.
size_t runner_up(const std::vector<Contender>& contenders);

// The bootstrap of one decision: `contenders` the chosen candidate first, then every alternative.
// Each replicate recomputes every contender's D on the same resampled sequences. Deterministic in
// `seed`.
DecisionGap decision_gap(const std::vector<Contender>& contenders, uint64_t seed,
                         size_t replicates = kDecisionReplicates);

struct DecisionCandidates {
  int64_t layer_id = 0;
  // Every assignment the decision measured (a level index per head) and its measured value.
  const std::map<std::vector<size_t>, double>* measured = nullptr;
  // Its per-sequence values (nullptr: none kept for it).
  std::function<const SequenceValues*(const std::vector<size_t>&)> per_sequence;
  const std::vector<solve::Group>* groups = nullptr;  // the layer's heads: each level's bytes
  int64_t allowance = 0;
  double price = 0.0;  // λ; not finite: 0
  std::vector<size_t> chosen;
  uint64_t seed = 0;
  size_t replicates = kDecisionReplicates;
};

// The decision's noise, or nothing when the chosen assignment has no per-sequence values.
std::optional<DecisionNoise> decision_noise(const DecisionCandidates& in);

}  // namespace headwise::calib::noise
