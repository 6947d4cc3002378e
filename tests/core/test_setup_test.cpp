// Planted cases for tests/support/check_test_setup.sh (the `test-setup` ctest entry): hidden tags
// ([.…]), so no ctest entry runs them. They show that a run with exactly four failing assertions
// (what Catch2 v2's own main would exit with, and ctest once read as "skipped") fails, and that an
// explicit skip is the only way to the skip exit code.
#include <catch2/catch.hpp>

#include "../support/skip.hpp"

TEST_CASE("planted: exactly four failing assertions", "[.planted-four-failures]") {
  for (int i = 0; i < 4; ++i) CHECK(i < 0);
}

TEST_CASE("planted: a test case that skips", "[.planted-skip]") {
  HEADWISE_SKIP("planted skip");
}

TEST_CASE("planted: a test case that passes", "[.planted-pass]") {
  CHECK(true);
}

TEST_CASE("planted: a skip after a failed assertion still fails", "[.planted-skip-after-failure]") {
  CHECK(false);
  HEADWISE_SKIP("planted skip after a failure");
}
