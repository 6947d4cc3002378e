// The parts stay in layers: the library never includes the command line (src/cli/ is compiled into
// the executable alone, with CLI11), and measure/ builds on arch/, never the reverse. A break
// here would show up as a link error only in some build, or as a cycle nobody meant. The task
// generators (tasks/) sit below both calib/ and eval/, which use them.
#include <catch2/catch.hpp>
#include "../support/test_paths.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = fs::weakly_canonical(fs::path(HEADWISE_FIXTURES_DIR) / ".." / "..");

// Files under `dirs` (relative to the repository) that include a header of `part`.
std::vector<std::string> includers(const std::vector<std::string>& dirs, const std::string& part) {
  const std::string needle = "#include \"headwise/" + part + "/";
  std::vector<std::string> out;
  for (const auto& dir : dirs) {
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / dir)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path());
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      if (text.find(needle) != std::string::npos)
        out.push_back(fs::relative(entry.path(), kRoot).string());
    }
  }
  return out;
}

std::vector<std::string> library_dirs_except(const std::string& part) {
  std::vector<std::string> out;
  for (const auto& root : {"src", "include/headwise"}) {
    for (const auto& entry : fs::directory_iterator(kRoot / root)) {
      if (entry.is_directory() && entry.path().filename() != part)
        out.push_back(fs::relative(entry.path(), kRoot).string());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("no library part includes the command line", "[core]") {
  const auto dirs = library_dirs_except("cli");
  REQUIRE(dirs.size() > 10);  // the scan sees the parts
  CHECK(includers(dirs, "cli").empty());
}

TEST_CASE("arch does not include measure (measure builds on arch)", "[core]") {
  CHECK(includers({"src/arch", "include/headwise/arch"}, "measure").empty());
  CHECK_FALSE(includers({"src/measure"}, "arch").empty());  // the direction that is meant
}

TEST_CASE("tasks does not include calib or eval (both build on the task generators)", "[core]") {
  CHECK(includers({"src/tasks", "include/headwise/tasks"}, "calib").empty());
  CHECK(includers({"src/tasks", "include/headwise/tasks"}, "eval").empty());
  CHECK_FALSE(includers({"src/calib"}, "tasks").empty());  // the direction that is meant
  CHECK_FALSE(includers({"src/eval"}, "tasks").empty());
}
