// Fuzzes policy::from_yaml. An accepted policy must survive a round trip: the writer's text
// reads back to a policy that writes the same text (the writer is deterministic).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.hpp"
#include "headwise/policy/policy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace headwise;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_accept_or_input_error([&] {
    const policy::Policy first = policy::from_yaml(text, "fuzz/policy.yaml");
    const std::string written = policy::to_yaml(first);
    policy::Policy second;
    try {
      second = policy::from_yaml(written, "fuzz/rewritten.yaml");
    } catch (const InputError& e) {
      std::fprintf(stderr, "rewritten policy rejected: %s\n---\n%s\n", e.what(), written.c_str());
      fuzz::fail("the reader rejects what the writer wrote");
    }
    if (policy::to_yaml(second) != written) fuzz::fail("round trip changed the policy");
  });
  return 0;
}
