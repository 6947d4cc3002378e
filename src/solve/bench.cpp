// Solver benchmark on instances shaped like real models: every head of a layer shares one byte
// ladder (bytes depend only on window and head_dim), sink tokens break the common divisor, and
// distortion curves span orders of magnitude between "local" and "retrieval" heads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::solve {
namespace {

constexpr int64_t kContext = 160 * 1024;
constexpr int64_t kBlock = 16;
constexpr int64_t kElementBytes = 2;  // bf16

// Geometric ladder 1k .. 64k (multiples of 64 tokens), then full.
std::vector<int64_t> window_ladder(int levels) {
  std::vector<int64_t> windows;
  const int finite = levels - 1;
  for (int i = 0; i < finite; ++i) {
    const double t = finite == 1 ? 0.0 : static_cast<double>(i) / (finite - 1);
    windows.push_back(static_cast<int64_t>(std::llround(1024.0 * std::pow(64.0, t) / 64.0)) * 64);
  }
  windows.push_back(kFullWindow);
  return windows;
}

// design.md memory model: ceil(min(w + S, C) / b) * b * head_dim * 2 (K and V) * s.
int64_t head_bytes(int64_t window, int64_t sinks, int64_t head_dim) {
  const int64_t tokens = window == kFullWindow ? kContext : std::min(window + sinks, kContext);
  return round_up(tokens, kBlock) * head_dim * 2 * kElementBytes;
}

}  // namespace

std::vector<Group> make_benchmark_groups(int layers, int heads, int levels, uint64_t seed,
                                         int64_t sink_tokens) {
  if (layers < 1 || heads < 1 || levels < 2) {
    throw_input_error("benchmark needs layers >= 1, heads >= 1, levels >= 2 (got {}, {}, {})",
                      layers, heads, levels);
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto windows = window_ladder(levels);
  std::vector<Group> groups;
  for (int layer = 0; layer < layers; ++layer) {
    const int64_t head_dim = layer % 4 == 3 ? 256 : 128;
    for (int head = 0; head < heads; ++head) {
      Group group{layer, head, {}};
      const double scale = std::pow(10.0, -4.0 + 4.0 * unit(rng));  // local ... retrieval heads
      const double decay = 0.2 + 2.8 * unit(rng);
      for (int64_t window : windows) {
        double distortion = 0.0;  // full KV: no truncation, no distortion
        if (window != kFullWindow) {
          distortion = scale * std::pow(1024.0 / static_cast<double>(window), decay) *
                       (0.9 + 0.2 * unit(rng));
        }
        group.options.push_back({window, head_bytes(window, sink_tokens, head_dim), distortion});
      }
      groups.push_back(std::move(group));
    }
  }
  return groups;
}

double benchmark_solver_ms(int layers, int heads, int levels, uint64_t seed, int64_t sink_tokens) {
  const auto groups = make_benchmark_groups(layers, heads, levels, seed, sink_tokens);
  const int64_t low = min_total_bytes(groups);
  const int64_t full = max_window_total_bytes(groups);
  double slowest = 0.0;
  for (int tenth = 1; tenth <= 9; ++tenth) {
    const int64_t budget = std::max(low, full / 10 * tenth);
    const auto start = std::chrono::steady_clock::now();
    const SolveResult result = solve_exact(groups, budget);
    const auto stop = std::chrono::steady_clock::now();
    HEADWISE_CHECK(result.total_bytes <= budget, "benchmark solution over budget");
    slowest = std::max(slowest, std::chrono::duration<double, std::milli>(stop - start).count());
  }
  return slowest;
}

}  // namespace headwise::solve
