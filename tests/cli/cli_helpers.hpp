#pragma once
// For the resume, regen and NaN tests: run_cli (support/temp_dir.hpp) plus environment
// variables and the killing signal, which the resume test needs to see.
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "../support/temp_dir.hpp"

namespace headwise::testing {

// `env`: assignments applied to the child ("A=1 B=2"). status: exit code, or -signal when the
// process was killed (exec: the shell becomes headwise-calc, so its signal is what we see).
inline CliRun run_cli_with(const std::string& arguments, const std::string& env = "") {
  TempDir scratch("cli");
  const auto err_path = scratch / "stderr.txt";
  const std::string command = "exec env " + env + " " + std::string(HEADWISE_CLI) + " " + arguments + " 2>" +
                              err_path.string();
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  REQUIRE(pipe);
  CliRun run;
  std::array<char, 4096> buffer{};
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe.get())) run.out.append(buffer.data(), n);
  const int status = ::pclose(pipe.release());
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1000;
  std::ifstream err(err_path, std::ios::binary);
  run.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  return run;
}

inline bool exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}

}  // namespace headwise::testing
