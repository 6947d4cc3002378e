#include "calib/walk/shard_constraint.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "headwise/core/error.hpp"
#include "headwise/memory/tensor_parallel.hpp"
#include "headwise/solve/symmetric.hpp"

namespace headwise::calib::seqcalib {
namespace {

using Assignment = std::vector<size_t>;

double finite_price(double price) {
  return std::isfinite(price) ? price : 0.0;
}

// Every shard's orderings of its levels in `base`, the other shards as in `base`, within `cap`
// candidates: which head of a shard takes which of its levels is what the curves decide least
// reliably (they are measured with the other heads at the descent's windows).
void add_shard_orderings(const std::vector<std::vector<int64_t>>& shards, const Assignment& base,
                         size_t cap, std::vector<Assignment>& out) {
  for (const auto& shard : shards) {
    Assignment levels;
    for (int64_t h : shard) levels.push_back(base[static_cast<size_t>(h)]);
    for (const auto& order : distinct_orderings(levels)) {
      if (out.size() >= cap) return;
      Assignment candidate = base;
      for (size_t i = 0; i < shard.size(); ++i) candidate[static_cast<size_t>(shard[i])] = order[i];
      if (std::find(out.begin(), out.end(), candidate) == out.end()) out.push_back(candidate);
    }
  }
}

// Every assignment of `heads` heads to `levels` levels whose shards hold the same multiset, or
// nullopt when there are more than `cap`. Replicated heads (fewer heads than ranks) share one
// level.
std::optional<std::vector<Assignment>> every_sharded_assignment(
    const std::vector<std::vector<int64_t>>& shards, size_t heads, size_t levels, size_t cap) {
  std::vector<Assignment> out;
  if (shards.size() > heads) {
    for (size_t l = 0; l < levels; ++l) out.emplace_back(heads, l);
    return out.size() <= cap ? std::optional(out) : std::nullopt;
  }
  const size_t k = shards.front().size();
  Assignment multiset(k, 0);
  while (true) {
    // Per shard one ordering of the multiset: the cartesian product over the shards.
    const std::vector<Assignment> per_shard = distinct_orderings(multiset);
    std::vector<size_t> pick(shards.size(), 0);
    while (true) {
      if (out.size() >= cap) return std::nullopt;
      Assignment a(heads, 0);
      for (size_t s = 0; s < shards.size(); ++s) {
        for (size_t i = 0; i < k; ++i) a[static_cast<size_t>(shards[s][i])] = per_shard[pick[s]][i];
      }
      out.push_back(std::move(a));
      size_t s = 0;
      while (s < pick.size() && ++pick[s] == per_shard.size()) pick[s++] = 0;
      if (s == pick.size()) break;
    }
    // The next non-decreasing multiset.
    size_t i = k;
    while (i > 0 && multiset[i - 1] + 1 == levels) --i;
    if (i == 0) break;
    const size_t next = multiset[i - 1] + 1;
    for (size_t j = i - 1; j < k; ++j) multiset[j] = next;
  }
  return out;
}

}  // namespace

bool constrained_to_shards(const RunInputs& in) {
  return in.options.tensor_parallel_size > 1;
}

solve::SolveResult solve_within_shards(const RunInputs& in, const std::vector<solve::Group>& groups,
                                       int64_t budget) {
  if (!constrained_to_shards(in)) return solve::solve_exact(groups, budget);
  return solve::solve_symmetric(groups, in.options.tensor_parallel_size, budget).result;
}

std::vector<size_t> shard_relaxed_choice(const RunInputs& in,
                                         const std::vector<solve::Group>& groups, int64_t allowance,
                                         double price) {
  std::vector<solve::Group> priced = groups;
  const double lambda = finite_price(price);
  for (auto& g : priced) {
    for (auto& o : g.options) o.distortion += lambda * static_cast<double>(o.bytes);
  }
  return solve_within_shards(in, priced, allowance).choice;
}

std::vector<size_t> shard_joint_choice(const RunInputs& in, int64_t layer_id,
                                       const std::vector<solve::Group>& groups, int64_t allowance,
                                       double price, const std::vector<size_t>& assign,
                                       const JointMeasure& joint, const JointPrefetch& prefetch) {
  const int64_t tp = in.options.tensor_parallel_size;
  const auto shards = memory::tensor_parallel_shards(static_cast<int64_t>(groups.size()), tp);
  std::vector<int64_t> windows;
  for (size_t h = 0; h < groups.size(); ++h) windows.push_back(groups[h].options[assign[h]].window);
  if (!memory::shard_mismatch(windows, tp)) return assign;

  auto candidates = every_sharded_assignment(shards, groups.size(), groups.front().options.size(),
                                             kMeasuredShardAssignments);
  const bool exhaustive = candidates.has_value();
  if (!exhaustive) {
    candidates.emplace();
    const Assignment base = shard_relaxed_choice(in, groups, allowance, price);
    candidates->push_back(base);
    add_shard_orderings(shards, base, kMeasuredShardAssignments, *candidates);
  }
  std::erase_if(*candidates,
                [&](const Assignment& a) { return layer_bytes(groups, a) > allowance; });
  HEADWISE_CHECK(!candidates->empty(), "layer {}: no assignment that shards over {} fits {} bytes",
                 layer_id, tp, allowance);
  if (prefetch) prefetch(*candidates);
  const double lambda = finite_price(price);
  const Assignment* best = nullptr;
  double best_j = std::numeric_limits<double>::infinity();
  for (const auto& a : *candidates) {
    const double j = joint(a) + lambda * static_cast<double>(layer_bytes(groups, a));
    if (best == nullptr || j < best_j) {
      best = &a;
      best_j = j;
    }
  }
  spdlog::info(
      "layer {}: [{}] does not shard over {} ranks; [{}] does (least J {:.6g} of {} {} "
      "assignments)",
      layer_id, in.labels_of(assign), tp, in.labels_of(*best), best_j, candidates->size(),
      exhaustive ? "sharding" : "measured");
  return *best;
}

}  // namespace headwise::calib::seqcalib
