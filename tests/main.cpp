// The suite's main: Catch2's session, with exit codes no failure count can be mistaken for
// (support/skip.hpp): 0 passed, 1 any failure, kSkipExitCode when every test case that ran
// skipped explicitly (e.g. the [gpu] tests without a GPU).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "support/skip.hpp"

namespace headwise::testing {

struct SkipRegistry {
  std::map<std::string, std::string> skipped;  // test case → reason
  std::set<std::string> ran;                   // every test case that ran
  std::set<std::string> failed;                // test cases with a failed assertion
};

SkipRegistry& registry() {
  static SkipRegistry r;
  return r;
}

void skip_current_test(const std::string& reason) {
  const std::string name = Catch::getResultCapture().getCurrentTestName();
  registry().skipped.emplace(name, reason);
  WARN("skipped: " << reason);
}

}  // namespace headwise::testing

namespace {

// Records every test case that ran and whether an assertion of it failed.
class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    headwise::testing::registry().ran.insert(stats.testInfo.name);
    if (stats.totals.assertions.failed > 0)
      headwise::testing::registry().failed.insert(stats.testInfo.name);
    TestEventListenerBase::testCaseEnded(stats);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipListener)

int main(int argc, char* argv[]) {
  using headwise::testing::registry;
  Catch::Session session;
  if (session.applyCommandLine(argc, argv) != 0) return 1;
  const auto& config = session.configData();
  const bool listing =
      config.listTests || config.listTags || config.listReporters || config.listTestNamesOnly;
  const int failed_assertions =
      session.run();  // min(255, failures) or, when listing, the count listed
  if (listing || config.showHelp) return 0;
  const auto& r = registry();
  for (const auto& [name, reason] : r.skipped)
    std::cout << "headwise-tests: skipped '" << name << "': " << reason << "\n";
  if (failed_assertions != 0 || !r.failed.empty()) return 1;
  const bool all_skipped = !r.skipped.empty() && r.skipped.size() == r.ran.size();
  return all_skipped ? headwise::testing::kSkipExitCode : 0;
}
