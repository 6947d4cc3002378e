#include "calib/walk/joint_descent.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include "headwise/core/error.hpp"

namespace headwise::calib {
namespace {

// One greedy step: among moves of a single head to another level that `allowed` admits, the
// one with the best (joint KL change) per (bytes change), measured at `assign`. Returns false
// when no move is admitted, or, with a `price` >= 0, when the best cut adds at least `price`
// per byte saved / the best lengthening removes at most `price` per byte spent. Ties: more
// bytes moved, then the lower head and level (stable).
bool best_joint_move(
    const std::vector<solve::Group>& groups, std::vector<size_t>& assign, const JointMeasure& joint,
    const std::function<bool(size_t head, size_t level, int64_t bytes_after)>& allowed,
    bool cutting, double price, const JointPrefetch& prefetch) {
  const int64_t bytes_here = layer_bytes(groups, assign);
  const auto admitted = [&](size_t h, size_t l) {
    if (cutting ? l >= assign[h] : l <= assign[h]) return false;
    const int64_t delta_bytes = groups[h].options[l].bytes - groups[h].options[assign[h]].bytes;
    return allowed(h, l, bytes_here + delta_bytes);
  };
  if (prefetch) {
    std::vector<std::vector<size_t>> step{assign};
    for (size_t h = 0; h < assign.size(); ++h) {
      for (size_t l = 0; l < groups[h].options.size(); ++l) {
        if (!admitted(h, l)) continue;
        step.push_back(assign);
        step.back()[h] = l;
      }
    }
    prefetch(step);
  }
  const double here = joint(assign);
  std::optional<std::tuple<double, int64_t, size_t, size_t>> best;
  for (size_t h = 0; h < assign.size(); ++h) {
    for (size_t l = 0; l < groups[h].options.size(); ++l) {
      if (!admitted(h, l)) continue;
      const int64_t delta_bytes = groups[h].options[l].bytes - groups[h].options[assign[h]].bytes;
      std::vector<size_t> moved = assign;
      moved[h] = l;
      const double delta_kl = joint(moved) - here;
      // Cutting: least KL added per byte saved. Lengthening: most KL removed per byte spent.
      const double rate = cutting
                              ? delta_kl / static_cast<double>(std::max<int64_t>(1, -delta_bytes))
                              : delta_kl / static_cast<double>(std::max<int64_t>(1, delta_bytes));
      const auto key = std::make_tuple(rate, -std::abs(delta_bytes), h, l);
      if (!best || key < *best) best = key;
    }
  }
  if (!best) return false;
  if (!cutting && std::get<0>(*best) >= 0.0) return false;  // lengthening must remove KL
  if (price >= 0.0 && (cutting ? std::get<0>(*best) >= price : -std::get<0>(*best) <= price))
    return false;
  assign[std::get<2>(*best)] = std::get<3>(*best);
  return true;
}

}  // namespace

std::vector<std::vector<size_t>> distinct_orderings(std::vector<size_t> levels) {
  std::sort(levels.begin(), levels.end());
  std::vector<std::vector<size_t>> out;
  do {
    out.push_back(levels);
  } while (std::next_permutation(levels.begin(), levels.end()));
  return out;
}

int64_t layer_bytes(const std::vector<solve::Group>& groups, const std::vector<size_t>& assign) {
  int64_t total = 0;
  for (size_t h = 0; h < groups.size(); ++h) total += groups[h].options[assign[h]].bytes;
  return total;
}

std::vector<size_t> greedy_joint_descent(const std::vector<solve::Group>& groups, int64_t allowance,
                                         const JointMeasure& joint, double price,
                                         const JointPrefetch& prefetch) {
  std::vector<size_t> assign;
  for (const auto& group : groups) assign.push_back(group.options.size() - 1);  // the top level
  const auto any = [](size_t, size_t, int64_t) { return true; };
  while (layer_bytes(groups, assign) > allowance) {
    const bool moved = best_joint_move(groups, assign, joint, any, true, -1.0, prefetch);
    HEADWISE_CHECK(moved, "greedy descent: nothing left to cut at {} bytes over an allowance of {}",
                   layer_bytes(groups, assign), allowance);
  }
  if (price >= 0.0) {
    while (best_joint_move(groups, assign, joint, any, true, price, prefetch)) {
    }
  }
  while (best_joint_move(
      groups, assign, joint,
      [allowance](size_t, size_t, int64_t bytes_after) { return bytes_after <= allowance; }, false,
      price, prefetch)) {
  }
  return assign;
}

// Every assignment one move from `assign` (one head at another level, or two heads at once) that
// keeps the layer within `allowance`, in a fixed order: heads, then levels.
static std::vector<std::vector<size_t>> moves_within(const std::vector<solve::Group>& groups,
                                                     const std::vector<size_t>& assign,
                                                     int64_t allowance) {
  std::vector<std::vector<size_t>> out;
  const auto keep_if_fits = [&](const std::vector<size_t>& candidate) {
    if (layer_bytes(groups, candidate) <= allowance) out.push_back(candidate);
  };
  for (size_t h = 0; h < assign.size(); ++h) {
    for (size_t l = 0; l < groups[h].options.size(); ++l) {
      if (l == assign[h]) continue;
      std::vector<size_t> one = assign;
      one[h] = l;
      keep_if_fits(one);
      for (size_t g = 0; g < assign.size(); ++g) {
        if (g == h) continue;
        for (size_t m = 0; m < groups[g].options.size(); ++m) {
          if (m == assign[g]) continue;
          std::vector<size_t> two = one;
          two[g] = m;
          keep_if_fits(two);
        }
      }
    }
  }
  return out;
}

// The best move of one head, or of two heads at once, that keeps the layer within `allowance`
// and lowers `measure`; applied, returns true. Ties: the first found (heads, then levels, in
// order), so the result is deterministic.
bool best_swap(const std::vector<solve::Group>& groups, std::vector<size_t>& assign,
               int64_t allowance, const JointMeasure& measure, const JointPrefetch& prefetch) {
  const std::vector<std::vector<size_t>> moves = moves_within(groups, assign, allowance);
  if (prefetch) {
    std::vector<std::vector<size_t>> step{assign};
    step.insert(step.end(), moves.begin(), moves.end());
    prefetch(step);
  }
  double best = measure(assign);
  std::optional<std::vector<size_t>> chosen;
  for (const auto& candidate : moves) {
    const double value = measure(candidate);
    // Relative margin: a move must beat rounding, or two equal choices would alternate.
    if (value < best - 1e-12 * std::max(1.0, std::abs(best))) {
      best = value;
      chosen = candidate;
    }
  }
  if (!chosen) return false;
  assign = *chosen;
  return true;
}

}  // namespace headwise::calib
