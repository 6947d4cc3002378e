#pragma once
// Runs headwise-calc as a child process (its own libtorch, exit codes, signals) for the
// end-to-end tests of calibrate, resume and regen.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>

#include "headwise/core/files.hpp"

namespace headwise::testing {

struct CliRun {
  int status = 0;     // exit code, or -signal when killed
  std::string out;
  std::string err;
};

// `env`: assignments put before the command ("A=1 B=2"); the shell applies them to the child.
inline CliRun run_cli_with(const std::string& args, const std::string& env = "") {
  static std::atomic<int> counter{0};
  const std::filesystem::path err_file = std::filesystem::temp_directory_path() /
      ("headwise_cli_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".txt");
  // exec: the shell becomes headwise-calc, so a signal that kills it is the status we see.
  const std::string command = "exec env " + env + " " + std::string(HEADWISE_CLI) + " " + args + " 2>" + err_file.string();
  CliRun r;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) r.out.append(buffer, n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1000;
  r.err = read_text_file(err_file);
  std::error_code ec;
  std::filesystem::remove(err_file, ec);
  return r;
}

inline bool exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}

}  // namespace headwise::testing
