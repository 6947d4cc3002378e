// The proof: for random policies on every registered architecture (tests/configs), the grouped
// cache holds exactly memory::estimate's bytes, across block sizes, sinks, dtypes and batch.
#include <catch2/catch.hpp>

#include <random>

#include "../test_configs.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/grouped_cache.hpp"

using namespace headwise;
using headwise::testing::spec_from_config;
using runtime::GroupedCache;

namespace {

memory::HeadWindows random_windows(const arch::ModelSpec& spec, std::mt19937_64& rng) {
  const std::vector<int64_t> ladder{1, 3, 16, 17, 100, 1000, memory::kFullWindow};
  std::uniform_int_distribution<size_t> pick(0, ladder.size() - 1);
  memory::HeadWindows out;
  for (int64_t id : spec.global_layer_ids()) {
    auto& heads = out[id];
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h)
      heads.push_back(ladder[pick(rng)]);
  }
  return out;
}

}  // namespace

TEST_CASE("grouped cache allocates exactly the estimated bytes on every architecture",
          "[runtime]") {
  const auto configs = headwise::testing::registered_configs();
  REQUIRE(configs.size() >= 7);  // the seven config-level families at least
  std::mt19937_64 rng(1234);
  const std::vector<DType> dtypes{DType::kBFloat16, DType::kFloat16, DType::kFloat32,
                                  DType::kFloat8E4M3};
  for (const auto& file : configs) {
    const auto spec = spec_from_config(file);
    // Real-size configs would allocate GiBs; tiny contexts keep the test cheap.
    for (int trial = 0; trial < 12; ++trial) {
      memory::MemoryOptions o;
      o.context = std::uniform_int_distribution<int64_t>(1, 300)(rng);
      o.batch = std::uniform_int_distribution<int64_t>(1, 3)(rng);
      o.block_size = std::vector<int64_t>{1, 7, 16, 64}[static_cast<size_t>(trial % 4)];
      o.sink_tokens = std::uniform_int_distribution<int64_t>(0, 5)(rng);
      o.kv_dtype = dtypes[static_cast<size_t>(trial) % dtypes.size()];
      if (trial % 5 == 4) o.state_dtype = DType::kFloat16;
      const auto windows = random_windows(spec, rng);
      const auto estimate = memory::estimate(spec, windows, o);
      const auto cache = GroupedCache::allocate(spec, windows, o);
      INFO(file << " trial " << trial << " C=" << o.context << " B=" << o.batch << " b="
                << o.block_size << " S=" << o.sink_tokens << " kv=" << dtype_name(o.kv_dtype));
      CHECK(cache.allocated_bytes() == estimate.total_bytes);
      CHECK(!cache.cuda_allocator_bytes().has_value());
    }
  }
}

TEST_CASE("grouped cache layout: groups, shapes, states match the spec", "[runtime]") {
  const auto spec = spec_from_config("falcon_h1_tiny.json");
  memory::MemoryOptions o;
  o.context = 50;
  o.batch = 2;
  o.block_size = 16;
  o.sink_tokens = 2;
  // layer 0: heads {full, 8}; layer 1: both 8 → one group of two heads
  auto cache = GroupedCache::allocate(spec, {{0, {memory::kFullWindow, 8}}, {1, {8, 8}}}, o);
  const auto& l0 = cache.layer(0);
  REQUIRE(l0.groups.size() == 2);
  CHECK(l0.groups[0].window == 8);
  CHECK(l0.groups[0].kv_heads == std::vector<int64_t>{1});
  CHECK(l0.groups[0].k.sizes().vec() == std::vector<int64_t>{2, 1, 16, 16});  // round_up(8 + 2, 16)
  CHECK(l0.groups[0].ring_length == 8);
  CHECK(l0.groups[1].window == memory::kFullWindow);
  CHECK(l0.groups[1].k.sizes().vec() == std::vector<int64_t>{2, 1, 64, 16});  // round_up(50, 16)
  CHECK(l0.groups[1].ring_length == 48);
  const auto& l1 = cache.layer(1);
  REQUIRE(l1.groups.size() == 1);
  CHECK(l1.groups[0].kv_heads == std::vector<int64_t>{0, 1});
  REQUIRE(l1.states.size() == 2);
  CHECK(l1.states.at("conv_state").sizes().vec() == std::vector<int64_t>{2, 96, 4});
  CHECK(l1.states.at("conv_state").scalar_type() == at::kBFloat16);
  CHECK(l1.states.at("ssm_state").sizes().vec() == std::vector<int64_t>{2, 4, 16, 8});
  CHECK(l1.states.at("ssm_state").scalar_type() == at::kFloat);

  const auto gpt = spec_from_config("gpt_oss_tiny.json");
  auto g = GroupedCache::allocate(gpt, memory::full_kv_windows(gpt), o);
  CHECK(g.layer(0).k.sizes().vec() == std::vector<int64_t>{2, 2, 16, 16});  // window 4, block 16
  CHECK(g.layer(0).groups.empty());
}

TEST_CASE("ring slot arithmetic: sinks first, then (p - S) mod R", "[runtime]") {
  CHECK(GroupedCache::global_slot(0, 2, 8) == 0);
  CHECK(GroupedCache::global_slot(1, 2, 8) == 1);
  CHECK(GroupedCache::global_slot(2, 2, 8) == 2);
  CHECK(GroupedCache::global_slot(9, 2, 8) == 9);
  CHECK(GroupedCache::global_slot(10, 2, 8) == 2);  // wraps over the oldest non-sink token
  CHECK(GroupedCache::global_slot(17, 2, 8) == 9);
  CHECK(GroupedCache::global_slot(5, 0, 4) == 1);
  // the last R positions always occupy distinct slots
  for (int64_t t = 20; t < 40; ++t) {
    std::set<int64_t> slots;
    for (int64_t p = t - 7; p <= t; ++p) slots.insert(GroupedCache::global_slot(p, 2, 8));
    CHECK(slots.size() == 8);
    CHECK(*slots.begin() >= 2);
  }
  CHECK(GroupedCache::sliding_slot(5, 4) == 1);
}

TEST_CASE("grouped cache rejects a policy that does not fit the model", "[runtime]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  memory::MemoryOptions o;
  o.context = 10;
  CHECK_THROWS_AS(GroupedCache::allocate(spec, {{1, {0, 0}}}, o), InputError);
  o.context = 0;
  CHECK_THROWS_WITH(GroupedCache::allocate(spec, memory::full_kv_windows(spec), o),
                    Catch::Contains("--context"));
}
