#pragma once
// Where the suite finds the checkout, the build tree and the binaries it runs. They are defined
// in one generated file of the build tree (test_paths.cpp, written by tests/CMakeLists.txt), not
// passed as -D flags to every test file: every other test file's command line is then the same in
// every clone, so a compiler cache serves a fresh clone's test build (tools/build.sh).
namespace headwise::testing::paths {
extern const char* const kSourceDir;    // the checkout
extern const char* const kBuildDir;     // the build tree
extern const char* const kFixturesDir;  // tests/fixtures
extern const char* const kCli;          // build/bin/headwise-calc
extern const char* const kKillHook;     // the resume tests' LD_PRELOAD library
}  // namespace headwise::testing::paths

#define HEADWISE_SOURCE_DIR (::headwise::testing::paths::kSourceDir)
#define HEADWISE_BUILD_DIR (::headwise::testing::paths::kBuildDir)
#define HEADWISE_FIXTURES_DIR (::headwise::testing::paths::kFixturesDir)
#define HEADWISE_CLI (::headwise::testing::paths::kCli)
#define HEADWISE_KILL_HOOK (::headwise::testing::paths::kKillHook)
