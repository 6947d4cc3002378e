#pragma once
// Shared by the libFuzzer harnesses. A parser may reject its input only with headwise's
// InputError (one line naming the file and key, exit code 1 in the CLI); anything else that
// escapes -- a raw nlohmann/yaml-cpp exception, an internal HEADWISE_CHECK, std::bad_alloc --
// means bad input reached code that assumed it was valid, so the harness aborts and libFuzzer
// saves the input as a finding.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>

#include "headwise/core/error.hpp"

namespace headwise::fuzz {

template <typename Fn>
void expect_accept_or_input_error(Fn&& fn) {
  try {
    fn();
  } catch (const InputError&) {
    // The documented way to reject input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finding: %s escaped: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "finding: %s\n", what);
  std::abort();
}

}  // namespace headwise::fuzz
