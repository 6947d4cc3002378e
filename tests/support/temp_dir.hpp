#pragma once
// Scratch folders and the CLI runner shared by the tests.
//
// POSIX calls on purpose: libtorch.so exports its own std::filesystem::remove_all, which the
// dynamic linker binds first and which crashes (a null call). Our folders are flat.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include "test_paths.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace headwise::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    std::string pattern = "/tmp/headwise-" + tag + "-XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    if (DIR* dir = ::opendir(path_.c_str())) {
      while (const dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") ::unlink((path_ / name).c_str());
      }
      ::closedir(dir);
    }
    ::rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  // Writes `text` to a file in the folder and returns its path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }

 private:
  std::filesystem::path path_;
};

struct CliRun {
  int status = -1;  // exit code, or -signal when killed
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs build/bin/headwise-calc with `arguments` (shell syntax), capturing stdout and stderr.
// `env`: assignments put before the command ("A=1 B=2"). exec: the shell becomes
// headwise-calc, so a signal that kills it is the status we see.
inline CliRun run_cli_with(const std::string& arguments, const std::string& env = "") {
  TempDir scratch("cli");
  const auto err_path = scratch / "stderr.txt";
  const std::string command = "exec env " + env + " " + std::string(HEADWISE_CLI) + " " +
                              arguments + " 2>" + err_path.string();
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  REQUIRE(pipe);
  CliRun run;
  std::array<char, 4096> buffer{};
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe.get()))
    run.out.append(buffer.data(), n);
  const int status = ::pclose(pipe.release());
  run.status = WIFEXITED(status)     ? WEXITSTATUS(status)
               : WIFSIGNALED(status) ? -WTERMSIG(status)
                                     : -1000;
  std::ifstream err(err_path, std::ios::binary);
  run.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  return run;
}

inline CliRun run_cli(const std::string& arguments) {
  return run_cli_with(arguments);
}

// A command line the CLI must refuse, a fragment its one-line error holds, and its exit status
// (1: bad input; 3: a budget below what the model needs).
struct Refusal {
  std::string args;
  std::string fragment;
  int status = 1;
};

// Each refusal exits with its status and one line on stderr holding its fragment, and writes
// nothing to `out` (the -o its arguments give): bad input gets no half-written output.
inline void check_refusals(const std::vector<Refusal>& refusals, const std::filesystem::path& out) {
  for (const auto& r : refusals) {
    INFO(r.args);
    const auto run = run_cli(r.args);
    CHECK(run.status == r.status);
    CHECK_THAT(run.err, Catch::Contains(r.fragment));
    CHECK(std::count(run.err.begin(), run.err.end(), '\n') == 1);
    CHECK(!std::filesystem::exists(out));
  }
}

}  // namespace headwise::testing
