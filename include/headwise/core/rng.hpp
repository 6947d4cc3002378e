#pragma once
// A seeded generator whose outputs are the same on every platform and standard library:
// std::mt19937_64 is fully specified, std's distributions are not, so we map ourselves.
#include <cstdint>
#include <random>

namespace headwise {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  // Uniform integer in [0, n), unbiased (rejection sampling).
  int64_t below(int64_t n);
  // Uniform integer in [lo, hi].
  int64_t between(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace headwise
