// policy.yaml's tensor_parallel_size (issue 57): written only when set, read back, and refused
// when the windows it claims do not shard over that many ranks.
#include <catch2/catch.hpp>

#include "../test_configs.hpp"
#include "headwise/core/error.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;
using headwise::testing::spec_from_config;

TEST_CASE("tensor_parallel_size: absent by default, round-trips, checked against the windows",
          "[policy]") {
  const auto spec = spec_from_config("bamba_tiny.json");  // global layers 1 and 3, 2 KV heads
  policy::Policy p;
  p.model_name = "bamba-tiny";
  p.context = 4096;
  p.dtype = DType::kBFloat16;
  p.window_levels = {256, 1024, policy::kFull};
  p.per_layer_policies = {{1, {256, 256}, {}, {}}, {3, {1024, policy::kFull}, {}, {}}};
  policy::fill_memory(p, spec);
  const std::string plain = policy::to_yaml(p);
  CHECK(plain.find("tensor_parallel_size") == std::string::npos);
  CHECK_FALSE(policy::from_yaml(plain, "p.yaml").tensor_parallel_size.has_value());

  // Layer 3's two heads differ: at 2 ranks each holds one, so the windows do not shard.
  p.tensor_parallel_size = 2;
  const std::string tp2 = policy::to_yaml(p);
  CHECK(tp2.find("\ntensor_parallel_size: 2\n") != std::string::npos);
  CHECK_THROWS_WITH(policy::from_yaml(tp2, "p.yaml"),
                    Catch::Contains("tensor_parallel_size") &&
                        Catch::Contains("layer 3's windows do not shard over 2 ranks"));
  p.per_layer_policies[1].kv_head_windows = {1024, 1024};
  policy::fill_memory(p, spec);
  const policy::Policy q = policy::from_yaml(policy::to_yaml(p), "p.yaml");
  CHECK(q.tensor_parallel_size == 2);
  CHECK(policy::to_yaml(q) == policy::to_yaml(p));
  // 2 heads over 3 ranks neither split nor replicate evenly.
  p.tensor_parallel_size = 3;
  CHECK_THROWS_AS(policy::from_yaml(policy::to_yaml(p), "p.yaml"), InputError);
}
