#include "headwise/core/rng.hpp"

#include "headwise/core/error.hpp"

namespace headwise {

int64_t Rng::below(int64_t n) {
  HEADWISE_CHECK(n > 0, "Rng::below({})", n);
  const auto range = static_cast<uint64_t>(n);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
  uint64_t value = next();
  while (value >= limit) value = next();
  return static_cast<int64_t>(value % range);
}

}  // namespace headwise
