// `cmake --install` gives a binary that works outside the source tree: it runs the main job
// from another folder and finds its shipped data (the haystack text) next to itself.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "../support/temp_dir.hpp"
#include "../support/test_paths.hpp"
#include "headwise/core/files.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;
namespace fs = std::filesystem;

namespace {

// Runs `command` in `dir` with a clean data environment; returns its exit status.
int run_in(const fs::path& dir, const std::string& command, const fs::path& log) {
  const std::string line = "cd '" + dir.string() + "' && env -u HEADWISE_DATA_DIR " + command +
                           " > '" + log.string() + "' 2>&1";
  const int status = std::system(line.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("an installed headwise-calc runs the main job and finds its data outside the source tree",
          "[cli]") {
  const testing::TempDir dir("install");
  const fs::path& prefix = dir.path();
  const fs::path log = prefix / "log.txt";
  const auto last_output = [&] { return fs::exists(log) ? read_text_file(log) : std::string(); };
  REQUIRE(run_in(prefix,
                 "cmake --install '" + std::string(HEADWISE_BUILD_DIR) + "' --prefix '" +
                     prefix.string() + "'",
                 log) == 0);
  const fs::path binary = prefix / "bin" / "headwise-calc";
  REQUIRE(fs::exists(binary));
  REQUIRE(fs::exists(prefix / "share" / "headwise" / "calib-data" / "haystack"));

  // A model outside the source tree, and the job run from the prefix.
  const fs::path work = prefix / "work";
  fs::create_directories(work);
  fs::copy(fs::path(HEADWISE_FIXTURES_DIR) / "qwen3_next_tiny", work / "model");
  const std::string job = fmt::format(
      "'{}' --model model --context 512 --windows 8,32,full --seq-len 96 --samples 2 --budget "
      "200k -q -o policy.yaml",
      binary.string());
  INFO(last_output());
  REQUIRE(run_in(work, job, log) == 0);
  const auto policy = policy::read_policy(work / "policy.yaml");
  CHECK(policy.memory.total_bytes <= 200 * 1024);

  // The haystack text comes from <prefix>/share/headwise, not the source tree.
  const std::string tokenizer =
      (fs::path(HEADWISE_FIXTURES_DIR) / "tokenizers" / "sentencepiece_llama2").string();
  const std::string calib = fmt::format(
      "'{}' make-calib -q --task qa_distractors --length 1k --samples 1 --seed 5 --tokenizer '{}' "
      "-o calib.jsonl",
      binary.string(), tokenizer);
  INFO(last_output());
  REQUIRE(run_in(work, calib, log) == 0);
  CHECK(fs::file_size(work / "calib.jsonl") > 0);
  // Without it the binary says where it looked and which variable to set, in one line.
  fs::rename(prefix / "share", prefix / "share-moved");
  CHECK(run_in(work, calib, log) != 0);
  const std::string err = read_text_file(log);
  CHECK(err.find("HEADWISE_DATA_DIR") != std::string::npos);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  // The variable points it there.
  CHECK(
      run_in(work,
             "HEADWISE_DATA_DIR='" + (prefix / "share-moved" / "headwise").string() + "' " + calib,
             log) == 0);
}
