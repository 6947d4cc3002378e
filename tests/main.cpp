#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "headwise/core/resources.hpp"

// As headwise-calc does: the bits of a forward must not depend on how many threads MKL picks.
int main(int argc, char* argv[]) {
  headwise::pin_intra_op_threads();
  return Catch::Session().run(argc, argv);
}
