#pragma once
// Per-KV-head window allocation under a byte budget: a multiple-choice knapsack (MCKP).
// Each group (one KV head of one global layer) picks exactly one option (a window with exact
// bytes and a measured distortion); the solver minimises total distortion with total bytes
// never above the budget.
//
// Tie rules (deterministic; the same input always gives byte-identical results):
//  * Options with equal bytes and equal distortion in one group: the larger window wins.
//  * Lagrangian relaxation (relax_at): per group argmin d + lambda*bytes; on equal value the
//    option with fewer bytes wins, so `min_fitting_lambda` has a smallest fitting lambda.
//  * Exact solver: minimise total distortion (ties: the fewest bytes); then, when
//    `spend_leftover` is set, leftover budget goes to free upgrades (an option with more bytes
//    and no more distortion), one step per group per pass, groups in input order, repeated
//    until nothing more fits. This hedges against curves that read 0 for every window longer
//    than the calibration sequences.
//  * Budget >= sum of each group's largest-window bytes: the largest window everywhere ("full
//    KV fits, nothing is compressed"), even where a noisy curve prefers a smaller window;
//    `proven_optimal` then says whether that is also the distortion minimum.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "headwise/core/window.hpp"

namespace headwise::solve {

// "No truncation" (JSON "full"): the project-wide constant, larger than every finite window,
// so "prefer the larger window" needs no special case.
using headwise::kFullWindow;
using headwise::window_label;

struct Option {
  int64_t window = 0;  // tokens, or kFullWindow
  int64_t bytes = 0;   // exact cache bytes of this head at this window
  double distortion = 0.0;
};

struct Group {
  int64_t layer_id = 0;
  int64_t kv_head = 0;
  std::vector<Option> options;
};

struct SolveResult {
  std::vector<size_t> choice;  // index into groups[g].options, one per group
  int64_t total_bytes = 0;
  double total_distortion = 0.0;  // summed in group order
  bool proven_optimal = false;    // false only when the state limit cut the exact search
};

struct SolveOptions {
  bool spend_leftover = true;
  // One exact search pass keeps at most this many DP states; beyond it the best solution found
  // so far is returned with proven_optimal = false. Realistic 512-head instances need < 10^5.
  size_t max_states = size_t{1} << 22;
};

// Throws InputError naming layer/head: no options, negative bytes, NaN/inf/negative
// distortion, duplicate windows, or byte totals that overflow int64.
void validate_groups(const std::vector<Group>& groups);

// Smallest feasible budget: the fewest bytes of every group, summed.
int64_t min_total_bytes(const std::vector<Group>& groups);
// Bytes of every group's largest window, summed ("full everywhere").
int64_t max_window_total_bytes(const std::vector<Group>& groups);

// Exact MCKP. InfeasibleError (stating the minimum budget) when min_total_bytes > budget.
SolveResult solve_exact(const std::vector<Group>& groups, int64_t budget,
                        const SolveOptions& options = {});

// Exact completion: groups with `fixed[g]` set keep that option; the others are solved exactly
// with what the fixed ones leave of `budget`. `fixed` has one entry per group.
SolveResult solve_completion(const std::vector<Group>& groups,
                             const std::vector<std::optional<size_t>>& fixed, int64_t budget,
                             const SolveOptions& options = {});

// Exact upgrade: every group keeps `current[g]` or moves to an option with at least as many
// bytes; minimises total distortion within `budget`.
SolveResult solve_upgrade(const std::vector<Group>& groups, const std::vector<size_t>& current,
                          int64_t budget, const SolveOptions& options = {});

// Lagrangian relaxation at multiplier lambda >= 0: each group independently takes
// argmin d + lambda * bytes (ties: fewer bytes, then larger window). Not budget-aware.
SolveResult relax_at(const std::vector<Group>& groups, double lambda);

// Smallest lambda >= 0 whose relaxed solution fits `budget` (an exact breakpoint of the
// groups' convex hulls, or 0). InfeasibleError when even the fewest bytes do not fit.
double min_fitting_lambda(const std::vector<Group>& groups, int64_t budget);

// Fitting a choice to a budget when the bytes are not a sum over groups: `total_bytes(choice)`
// is the exact total (vLLM's reservation, where page unification and grouping couple heads);
// Option::bytes is ignored. From `start`, single-group moves (one group to another option) and
// layer moves (every group of one layer_id to one window), each priced by `total_bytes`:
//  1. promotions: a move to a larger window that adds no bytes and no distortion, taken while
//     any exists (a window that costs what a larger one costs gets the larger one);
//  2. while the total is above `budget`: the move that saves bytes at the least distortion added
//     per byte saved (ties: the larger saving, then the lower group and option);
//  3. while some move to a larger window lowers the distortion and fits: the one that removes the
//     most distortion per byte added (free ones first); then promotions again.
// The result fits `budget`; InfeasibleError (with the smallest total reached) when no sequence of
// such moves gets there. Deterministic: the same input gives the same choice.
using TotalBytesFn = std::function<int64_t(const std::vector<size_t>& choice)>;
SolveResult fit_coupled(const std::vector<Group>& groups, const std::vector<size_t>& start,
                        const TotalBytesFn& total_bytes, int64_t budget);

// Benchmark: a realistic random instance (context 160k, block 16, head_dim 128/256, bf16,
// `sink_tokens` sinks) of layers x heads groups with `levels` windows; returns the slowest
// solve_exact time in milliseconds over budgets from 10% to 90% of full KV.
double benchmark_solver_ms(int layers, int heads, int levels, uint64_t seed,
                           int64_t sink_tokens = 4);

// The instance the benchmark solves, for tests and tools.
std::vector<Group> make_benchmark_groups(int layers, int heads, int levels, uint64_t seed,
                                         int64_t sink_tokens);

}  // namespace headwise::solve
