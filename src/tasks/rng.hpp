#pragma once
// A portable seeded random source: std::mt19937_64's output sequence is fixed by the
// standard, but std::uniform_int_distribution and std::shuffle are not, so the mappings
// to ranges and permutations are our own. Same seed, same data, on every platform.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace headwise::tasks {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // Uniform integer in [0, n) by rejection sampling (no modulo bias). n must be > 0.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x = engine_();
    while (x >= limit) x = engine_();
    return x % n;
  }
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo + 1))); }

  template <typename T>
  const T& pick(const std::vector<T>& items) { return items[below(items.size())]; }

  template <typename T>
  void shuffle(std::vector<T>& items) {
    for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[below(i)]);
  }

  // A random decimal number with exactly `digits` digits (no leading zero).
  std::string number(int digits) {
    std::string out(1, static_cast<char>('1' + below(9)));
    while (static_cast<int>(out.size()) < digits) out.push_back(static_cast<char>('0' + below(10)));
    return out;
  }

  // A random UUID-shaped hex string (8-4-4-4-12), as RULER's uuid needles.
  std::string uuid() {
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (int group : {8, 4, 4, 4, 12}) {
      if (!out.empty()) out.push_back('-');
      for (int i = 0; i < group; ++i) out.push_back(hex[below(16)]);
    }
    return out;
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace headwise::tasks
