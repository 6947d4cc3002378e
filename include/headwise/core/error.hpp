#pragma once
// Typed errors. The library throws; `main` catches once, prints one line, exits non-zero.
// Messages name the file, tensor, field or flag at fault and, where possible, how to fix it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace headwise {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The user's input is wrong: a flag, a file, a field, a tensor.
class InputError : public Error {
 public:
  using Error::Error;
};

// The input is well-formed but asks for something headwise does not support.
class UnsupportedError : public InputError {
 public:
  using InputError::InputError;
};

// The request cannot be met (budget too small, memory will not fit).
class InfeasibleError : public Error {
 public:
  using Error::Error;
};

// Numerical failure at run time (NaN/Inf), with the layer and head that produced it.
class NumericError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void throw_input_error(fmt::format_string<Args...> format, Args&&... args) {
  throw InputError(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void throw_unsupported(fmt::format_string<Args...> format, Args&&... args) {
  throw UnsupportedError(fmt::format(format, std::forward<Args>(args)...));
}

// For our own invariants: a failure here is a headwise bug, not bad input.
#define HEADWISE_CHECK(cond, ...)                                                            \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw ::headwise::Error(fmt::format("internal error at {}:{}: {}", __FILE__, __LINE__, \
                                          fmt::format(__VA_ARGS__)));                        \
    }                                                                                        \
  } while (0)

}  // namespace headwise
