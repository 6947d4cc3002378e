// fit_coupled: the budget fit for totals that are not a sum over groups (mckp.hpp).
#include <cmath>
#include <limits>
#include <optional>

#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::solve {
namespace {

struct Move {
  std::vector<size_t> choice;
  int64_t bytes = 0;        // the exact total after the move
  double distortion = 0.0;  // summed after the move
};

double distortion_of(const std::vector<Group>& groups, const std::vector<size_t>& choice) {
  double d = 0.0;
  for (size_t g = 0; g < groups.size(); ++g) d += groups[g].options[choice[g]].distortion;
  return d;
}

int64_t window_sum_delta(const std::vector<Group>& groups, const std::vector<size_t>& from,
                         const std::vector<size_t>& to) {
  // Windows compare as levels: kFullWindow is the largest.
  int64_t larger = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t a = groups[g].options[from[g]].window, b = groups[g].options[to[g]].window;
    larger += (b > a) - (b < a);
  }
  return larger;
}

// Every single-group move, then every layer move (all groups of a layer to one window), in a
// fixed order.
std::vector<std::vector<size_t>> candidate_moves(const std::vector<Group>& groups,
                                                 const std::vector<size_t>& current) {
  std::vector<std::vector<size_t>> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].options.size(); ++i) {
      if (i == current[g]) continue;
      std::vector<size_t> c = current;
      c[g] = i;
      out.push_back(std::move(c));
    }
  }
  for (size_t first = 0; first < groups.size();) {
    size_t last = first;
    while (last < groups.size() && groups[last].layer_id == groups[first].layer_id) ++last;
    if (last - first > 1) {
      for (const Option& option : groups[first].options) {
        std::vector<size_t> c = current;
        bool everywhere = true, changes = false;
        for (size_t g = first; g < last && everywhere; ++g) {
          everywhere = false;
          for (size_t i = 0; i < groups[g].options.size(); ++i) {
            if (groups[g].options[i].window != option.window) continue;
            everywhere = true;
            changes = changes || i != current[g];
            c[g] = i;
          }
        }
        if (everywhere && changes) out.push_back(std::move(c));
      }
    }
    first = last;
  }
  return out;
}

class Fitter {
 public:
  Fitter(const std::vector<Group>& groups, const TotalBytesFn& total, int64_t budget)
      : groups_(groups), total_(total), budget_(budget) {}

  Move evaluate(std::vector<size_t> choice) const {
    Move m;
    m.bytes = total_(choice);
    m.distortion = distortion_of(groups_, choice);
    m.choice = std::move(choice);
    return m;
  }

  // Step 1: a larger window for no more bytes and no more distortion.
  bool promote(Move& current) const {
    for (auto& c : candidate_moves(groups_, current.choice)) {
      if (window_sum_delta(groups_, current.choice, c) <= 0) continue;
      if (!only_larger(current.choice, c)) continue;
      Move m = evaluate(std::move(c));
      if (m.bytes <= current.bytes && m.distortion <= current.distortion) {
        current = std::move(m);
        return true;
      }
    }
    return false;
  }

  // Step 2: the cheapest saving in distortion per byte.
  bool shrink(Move& current) const {
    std::optional<Move> best;
    double best_rate = 0.0;
    for (auto& c : candidate_moves(groups_, current.choice)) {
      Move m = evaluate(std::move(c));
      const int64_t saved = current.bytes - m.bytes;
      if (saved <= 0) continue;
      const double rate = (m.distortion - current.distortion) / static_cast<double>(saved);
      if (!best || rate < best_rate || (rate == best_rate && current.bytes - best->bytes < saved)) {
        best = std::move(m);
        best_rate = rate;
      }
    }
    if (!best) return false;
    current = std::move(*best);
    return true;
  }

  // Step 3: the best distortion removed per byte added, within the budget.
  bool grow(Move& current) const {
    std::optional<Move> best;
    double best_rate = 0.0;
    for (auto& c : candidate_moves(groups_, current.choice)) {
      if (!only_larger(current.choice, c)) continue;
      Move m = evaluate(std::move(c));
      const double removed = current.distortion - m.distortion;
      if (removed <= 0.0 || m.bytes > budget_) continue;
      const int64_t added = m.bytes - current.bytes;
      const double rate = added <= 0 ? std::numeric_limits<double>::infinity()
                                     : removed / static_cast<double>(added);
      if (!best || rate > best_rate) {
        best = std::move(m);
        best_rate = rate;
      }
    }
    if (!best) return false;
    current = std::move(*best);
    return true;
  }

 private:
  bool only_larger(const std::vector<size_t>& from, const std::vector<size_t>& to) const {
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].options[to[g]].window < groups_[g].options[from[g]].window) return false;
    }
    return true;
  }

  const std::vector<Group>& groups_;
  const TotalBytesFn& total_;
  int64_t budget_;
};

}  // namespace

SolveResult fit_coupled(const std::vector<Group>& groups, const std::vector<size_t>& start,
                        const TotalBytesFn& total_bytes, int64_t budget) {
  validate_groups(groups);
  HEADWISE_CHECK(start.size() == groups.size(), "fit_coupled: {} choices for {} groups",
                 start.size(), groups.size());
  for (size_t g = 0; g < groups.size(); ++g)
    HEADWISE_CHECK(start[g] < groups[g].options.size(), "fit_coupled: choice out of range");
  const Fitter fitter(groups, total_bytes, budget);
  Move current = fitter.evaluate(start);
  while (fitter.promote(current)) {
  }
  while (current.bytes > budget) {
    if (!fitter.shrink(current)) {
      throw InfeasibleError(
          fmt::format("no choice of levels fits {} bytes: the smallest total reached is {} ({})",
                      budget, current.bytes, format_bytes(current.bytes)));
    }
  }
  while (fitter.grow(current) || fitter.promote(current)) {
  }
  SolveResult out;
  out.choice = current.choice;
  out.total_bytes = current.bytes;
  out.total_distortion = current.distortion;
  out.proven_optimal = false;
  return out;
}

}  // namespace headwise::solve
