#pragma once
// Overflow-checked arithmetic for the memory models: sizes come from user input (context,
// batch), so overflow must be an error naming the likely cause, never a wrap.
#include <cstdint>

#include "headwise/core/error.hpp"

namespace headwise::memory {

inline int64_t checked_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw_input_error("memory size overflows 64 bits ({} x {}): context or batch is too large", a,
                      b);
  }
  return out;
}

inline int64_t checked_add(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out))
    throw_input_error("memory size overflows 64 bits: context or batch is too large");
  return out;
}

}  // namespace headwise::memory
