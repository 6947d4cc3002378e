#pragma once
// A seeded generator whose outputs are the same on every platform and standard library:
// std::mt19937_64 is fully specified, but std's distributions and std::shuffle are not, so the
// mappings to ranges, picks and permutations are our own. Same seed, same data, everywhere.
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace headwise {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  // Uniform integer in [0, n), unbiased (rejection sampling). n must be > 0.
  int64_t below(int64_t n);
  // The same over the whole unsigned range (n = UINT64_MAX: a random sort key).
  uint64_t below_unsigned(uint64_t n);
  // Uniform integer in [lo, hi].
  int64_t between(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // One element, uniformly; `items` must not be empty.
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[index_below(items.size())];
  }

  // A uniformly random permutation in place (Fisher-Yates, from the back).
  template <typename T>
  void shuffle(std::vector<T>& items) {
    for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[index_below(i)]);
  }

 private:
  size_t index_below(size_t n) { return static_cast<size_t>(below(static_cast<int64_t>(n))); }

  std::mt19937_64 engine_;
};

}  // namespace headwise
