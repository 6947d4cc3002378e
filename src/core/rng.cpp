#include "headwise/core/rng.hpp"

#include "headwise/core/error.hpp"

namespace headwise {

int64_t Rng::below(int64_t n) {
  HEADWISE_CHECK(n > 0, "Rng::below({})", n);
  return static_cast<int64_t>(below_unsigned(static_cast<uint64_t>(n)));
}

uint64_t Rng::below_unsigned(uint64_t n) {
  HEADWISE_CHECK(n > 0, "Rng::below_unsigned(0)");
  // Only values below a multiple of n are kept, so that every residue is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t value = next();
  while (value >= limit) value = next();
  return value % n;
}

}  // namespace headwise
