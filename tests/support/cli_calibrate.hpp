#pragma once
// Calibrating through the CLI in a test: the policy a command line writes, its run required to
// succeed.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "temp_dir.hpp"

namespace headwise::testing {

// Calibrates into `dir`/`name`.yaml with `args` and returns the policy's text.
inline std::string calibrate(const TempDir& dir, const std::string& name, const std::string& args) {
  const std::filesystem::path out = dir / (name + ".yaml");
  const auto run = run_cli(args + " -o " + out.string());
  INFO(args << "\n" << run.err);
  REQUIRE(run.status == 0);
  std::ifstream in(out, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace headwise::testing
