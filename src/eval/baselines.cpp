#include "headwise/eval/baselines.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "headwise/core/error.hpp"
#include "headwise/core/rng.hpp"

namespace headwise::eval {
namespace {

struct HeadRef {
  int64_t layer;
  size_t head;
};

std::vector<HeadRef> all_heads(const arch::ModelSpec& spec) {
  std::vector<HeadRef> out;
  for (int64_t id : spec.global_layer_ids()) {
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h)
      out.push_back({id, static_cast<size_t>(h)});
  }
  return out;
}

// A window long enough to keep the whole context costs exactly what `full` costs; say full.
int64_t normalise(int64_t window, const memory::MemoryOptions& o) {
  return window >= o.context - o.sink_tokens ? kFullWindow : window;
}

// Largest integer x in [lo, hi] with fits(x), given fits is monotone (true then false);
// lo - 1 when none fits.
template <class Fits>
int64_t largest_fitting(int64_t lo, int64_t hi, Fits fits) {
  if (!fits(lo)) return lo - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

int64_t head_cost(const arch::ModelSpec& spec, const HeadRef& h, int64_t window,
                  const memory::MemoryOptions& o) {
  return memory::head_bytes(*spec.layer(h.layer).attention, window, o);
}

// Lengthens single heads' windows, in `order`, as far as `budget` allows: after it, no head can
// take one more block, so less than one block per head is left unspent.
void top_up(const arch::ModelSpec& spec, const memory::MemoryOptions& o, int64_t budget,
            memory::HeadWindows& windows, const std::vector<HeadRef>& order) {
  int64_t spent = global_kv_bytes(spec, windows, o);
  for (const auto& h : order) {
    int64_t& w = windows[h.layer][h.head];
    if (w == kFullWindow) continue;
    const int64_t base = head_cost(spec, h, w, o);
    const int64_t longest = largest_fitting(
        w, o.context, [&](int64_t x) { return spent - base + head_cost(spec, h, x, o) <= budget; });
    spent += head_cost(spec, h, longest, o) - base;
    w = normalise(longest, o);
  }
}

// `counted`: what the bytes are (the global layers' K/V, plus selection bookkeeping where the
// method selects tokens), so the message compares like with like.
void require_fits(int64_t needed, int64_t budget, const char* what,
                  const char* counted = "global-KV bytes") {
  if (needed > budget) {
    throw InfeasibleError(
        fmt::format("{} baseline: its smallest assignment needs {} {}, the policy has {}", what,
                    needed, counted, budget));
  }
}

}  // namespace

int64_t global_kv_bytes(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                        const memory::MemoryOptions& o) {
  int64_t total = 0;
  for (const auto& [layer, heads] : windows) {
    for (int64_t w : heads) total += memory::head_bytes(*spec.layer(layer).attention, w, o);
  }
  return total;
}

int64_t one_block_per_head(const arch::ModelSpec& spec, const memory::MemoryOptions& o) {
  int64_t total = 0;
  for (const auto& h : all_heads(spec)) {
    const auto& att = *spec.layer(h.layer).attention;
    total += o.batch * o.block_size * att.head_dim * 2 * element_size(o.kv_dtype);
  }
  return total;
}

memory::HeadWindows uniform_baseline(const arch::ModelSpec& spec, const memory::MemoryOptions& o,
                                     int64_t budget) {
  const auto cost = [&](int64_t w) {
    return global_kv_bytes(spec, memory::uniform_windows(spec, w), o);
  };
  require_fits(cost(1), budget, "uniform");
  const int64_t w = largest_fitting(1, o.context, [&](int64_t x) { return cost(x) <= budget; });
  return memory::uniform_windows(spec, normalise(w, o));
}

memory::HeadWindows pyramid_baseline(const arch::ModelSpec& spec, const memory::MemoryOptions& o,
                                     int64_t budget) {
  const auto layers = spec.global_layer_ids();
  const auto g = static_cast<int64_t>(layers.size());
  // Shares 2(G-j)-1 over G average 1; the scale s is the mean window in tokens.
  const auto windows_at = [&](int64_t s) {
    memory::HeadWindows out;
    for (int64_t j = 0; j < g; ++j) {
      const int64_t w = std::max<int64_t>(1, s * (2 * (g - j) - 1) / g);
      out[layers[static_cast<size_t>(j)]] = std::vector<int64_t>(
          static_cast<size_t>(spec.layer(layers[static_cast<size_t>(j)]).attention->num_kv_heads),
          normalise(std::min(w, o.context), o));
    }
    return out;
  };
  require_fits(global_kv_bytes(spec, windows_at(1), o), budget, "pyramid");
  const int64_t s = largest_fitting(1, o.context * std::max<int64_t>(g, 1), [&](int64_t x) {
    return global_kv_bytes(spec, windows_at(x), o) <= budget;
  });
  auto windows = windows_at(s);
  top_up(spec, o, budget, windows,
         all_heads(spec));  // shallow layers first: they get the most anyway
  return windows;
}

memory::HeadWindows random_baseline(const arch::ModelSpec& spec, const memory::MemoryOptions& o,
                                    int64_t budget, const std::vector<int64_t>& ladder,
                                    uint64_t seed) {
  HEADWISE_CHECK(!ladder.empty(), "random baseline needs a ladder");
  Rng rng(seed);
  auto heads = all_heads(spec);
  memory::HeadWindows windows;
  for (const auto& h : heads) windows[h.layer].push_back(ladder.front());
  require_fits(global_kv_bytes(spec, windows, o), budget, "random");
  rng.shuffle(heads);
  int64_t spent = global_kv_bytes(spec, windows, o);
  for (const auto& h : heads) {
    const int64_t base = head_cost(spec, h, ladder.front(), o);
    std::vector<int64_t> fitting;
    for (int64_t level : ladder) {
      if (spent - base + head_cost(spec, h, level, o) <= budget) fitting.push_back(level);
    }
    const int64_t pick = rng.pick(fitting);
    spent += head_cost(spec, h, pick, o) - base;
    windows[h.layer][h.head] = pick;
  }
  top_up(spec, o, budget, windows, heads);
  return windows;
}

memory::HeadWindows ranked_full_baseline(const arch::ModelSpec& spec,
                                         const memory::MemoryOptions& o, int64_t budget,
                                         const HeadScores& scores, int64_t short_window,
                                         const char* name) {
  auto heads = all_heads(spec);
  const auto score = [&](const HeadRef& h) { return scores.at(h.layer).at(h.head); };
  // Highest score first; ties by position so the ranking is deterministic.
  std::stable_sort(heads.begin(), heads.end(),
                   [&](const HeadRef& a, const HeadRef& b) { return score(a) > score(b); });
  memory::HeadWindows windows;
  for (const auto& h : all_heads(spec)) windows[h.layer].push_back(short_window);
  require_fits(global_kv_bytes(spec, windows, o), budget, name);
  int64_t spent = global_kv_bytes(spec, windows, o);
  size_t promoted = 0;
  // In rank order, stopping at the first head that does not fit: the ranking, not the byte
  // sizes, decides which heads are retrieval heads.
  for (; promoted < heads.size(); ++promoted) {
    const auto& h = heads[promoted];
    const int64_t extra = head_cost(spec, h, kFullWindow, o) - head_cost(spec, h, short_window, o);
    if (spent + extra > budget) break;
    spent += extra;
    windows[h.layer][h.head] = kFullWindow;
  }
  // The streaming heads share one window, as long as the leftover allows.
  const std::vector<HeadRef> rest(heads.begin() + static_cast<std::ptrdiff_t>(promoted),
                                  heads.end());
  const auto with_short = [&](int64_t w) {
    auto out = windows;
    for (const auto& h : rest) out[h.layer][h.head] = w;
    return out;
  };
  const int64_t w = largest_fitting(short_window, o.context, [&](int64_t x) {
    return global_kv_bytes(spec, with_short(x), o) <= budget;
  });
  windows = with_short(normalise(w, o));
  top_up(spec, o, budget, windows, rest);
  return windows;
}

int64_t selecting_bytes(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                        const memory::MemoryOptions& o) {
  int64_t total = global_kv_bytes(spec, windows, o);
  for (const auto& [layer, heads] : windows)
    total += memory::selection_bytes(*spec.layer(layer).attention, heads, o);
  return total;
}

memory::HeadWindows uniform_selecting_baseline(const arch::ModelSpec& spec,
                                               const memory::MemoryOptions& o, int64_t budget) {
  const auto cost = [&](int64_t w) {
    return selecting_bytes(spec, memory::uniform_windows(spec, w), o);
  };
  require_fits(cost(1), budget, "uniform eviction",
               "bytes of global K/V plus selection bookkeeping (one block per head)");
  const int64_t w = largest_fitting(1, o.context, [&](int64_t x) { return cost(x) <= budget; });
  return memory::uniform_windows(spec, normalise(w, o));
}

PyramidKVAllocation pyramidkv_baseline(const arch::ModelSpec& spec, const memory::MemoryOptions& o,
                                       int64_t budget, int64_t observation_window, double beta) {
  if (observation_window <= 0)
    throw_input_error("pyramidkv: the observation window must be positive, got {}",
                      observation_window);
  if (!(beta >= 1.0)) throw_input_error("pyramidkv: beta must be at least 1, got {}", beta);
  const auto layers = spec.global_layer_ids();
  const auto g = static_cast<int64_t>(layers.size());
  const auto obs = static_cast<double>(observation_window);
  const double prefix_room = static_cast<double>(o.context) - obs;
  // The layers' token counts for a mean prefix budget P, or nullopt where the pyramid is not
  // well formed (KVCache-Factory's condition context >= max >= min >= window).
  const auto pyramid_at = [&](int64_t p) -> std::optional<memory::HeadWindows> {
    double low = static_cast<double>(p) / beta;
    double high = 2.0 * static_cast<double>(p) - low;
    if (high >= prefix_room) {
      high = prefix_room;
      low = 2.0 * static_cast<double>(p) - high;
    }
    if (!(static_cast<double>(o.context) >= high && high >= low && low >= obs)) return std::nullopt;
    const double step = g > 1 ? (high - low) / static_cast<double>(g - 1) : 0.0;
    memory::HeadWindows out;
    for (int64_t j = 0; j < g; ++j) {
      const int64_t tokens =
          observation_window + std::llround(high - static_cast<double>(j) * step);
      const auto heads =
          static_cast<size_t>(spec.layer(layers[static_cast<size_t>(j)]).attention->num_kv_heads);
      out[layers[static_cast<size_t>(j)]] =
          std::vector<int64_t>(heads, normalise(std::clamp<int64_t>(tokens, 1, o.context), o));
    }
    return out;
  };
  const auto fits = [&](int64_t p) {
    const auto w = pyramid_at(p);
    return w && selecting_bytes(spec, *w, o) <= budget;
  };
  // The pyramid exists from P = beta x window on (min reaches the window); search up from there.
  const auto first = static_cast<int64_t>(std::ceil(beta * obs));
  if (first <= o.context && fits(first)) {
    const int64_t p = largest_fitting(first, o.context, fits);
    return {*pyramid_at(p), true, p};
  }
  return {uniform_selecting_baseline(spec, o, budget), false, 0};
}

}  // namespace headwise::eval
