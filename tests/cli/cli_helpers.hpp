#pragma once
// Runs headwise-calc as a child process (its own libtorch, exit codes, signals) for the
// end-to-end tests of calibrate, resume and regen.
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>

#include "../support/temp_dir.hpp"
#include "headwise/core/files.hpp"

namespace headwise::testing {

inline bool exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}

}  // namespace headwise::testing
