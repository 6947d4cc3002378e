#pragma once
// One global layer's decision and how sure it is (DecisionNoise, headwise/calib/seqcalib.hpp): the
// bootstrap of bootstrap.hpp over the candidates the decision measured.
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
