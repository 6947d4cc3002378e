// Hand-computed memory figures for every layer kind, the capacity search against brute force,
// and bad options. The arithmetic in comments is the check: change the model, redo it by hand.
#include <catch2/catch.hpp>

#include "../test_configs.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/memory_model.hpp"

using namespace headwise;
using headwise::testing::spec_from_config;
using memory::MemoryOptions;

namespace {
MemoryOptions opts(int64_t context, int64_t batch = 1, int64_t block = 16, int64_t sinks = 0,
                   DType kv = DType::kBFloat16) {
  MemoryOptions o;
  o.context = context;
  o.batch = batch;
  o.block_size = block;
  o.sink_tokens = sinks;
  o.kv_dtype = kv;
  return o;
}
}  // namespace

TEST_CASE("global full KV + mamba2 states, by hand (bamba tiny)", "[memory]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  const auto e = memory::estimate(spec, memory::full_kv_windows(spec), opts(100, 3));
  // global layers 1,3: 2 KV heads, hd 16: round_up(100,16)=112 slots * 16 * 2 (K,V) * 2 B = 7168 /
  // head
  CHECK(e.components.global_kv_bytes == 3 * 2 * 2 * 7168);
  // mamba layers 0,2: conv 192*4*2 = 1536 + ssm 8*16*16*4 = 8192 → 9728 / layer
  CHECK(e.components.ssm_state_bytes == 3 * 2 * 9728);
  CHECK(e.components.local_kv_bytes == 0);
  CHECK(e.components.linear_state_bytes == 0);
  CHECK(e.components.other_state_bytes == 0);
  CHECK(e.total_bytes == 144384);
  CHECK(e.total_bytes == e.components.total());
  REQUIRE(e.layers.size() == 4);
  CHECK(e.layers[0].bytes == 3 * 9728);
  CHECK(!e.layers[0].kv_head_windows);
  CHECK(e.layers[1].bytes == 3 * 2 * 7168);
  CHECK(e.layers[1].kv_head_windows ==
        std::vector<int64_t>{memory::kFullWindow, memory::kFullWindow});
  CHECK(memory::full_kv_bytes(spec, opts(100, 3)) == 144384);
  CHECK(memory::fixed_bytes(spec, opts(100, 3)) == 3 * 2 * 9728);
}

TEST_CASE("windows with sinks, block rounding, unpaged, dtype", "[memory]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  const auto w10 = memory::uniform_windows(spec, 10);
  // min(10 + 4, 100) = 14 → 16 slots * 16 * 2 * 2 = 1024 / head; 4 heads; batch 3
  CHECK(memory::estimate(spec, w10, opts(100, 3, 16, 4)).components.global_kv_bytes ==
        3 * 4 * 1024);
  // unpaged: 14 slots * 64 = 896 / head
  CHECK(memory::estimate(spec, w10, opts(100, 3, 1, 4)).components.global_kv_bytes == 3 * 4 * 896);
  // context below the window: min(14, 9) = 9 slots unpaged
  CHECK(memory::estimate(spec, w10, opts(9, 1, 1, 4)).components.global_kv_bytes == 4 * 9 * 64);
  // fp32 doubles, fp8 halves the bf16 KV
  CHECK(
      memory::estimate(spec, w10, opts(100, 1, 1, 4, DType::kFloat32)).components.global_kv_bytes ==
      4 * 1792);
  CHECK(memory::estimate(spec, w10, opts(100, 1, 1, 4, DType::kFloat8E4M3))
            .components.global_kv_bytes == 4 * 448);
  // mixed per-head windows: layer 1 {full, 10}, layer 3 {10, 10}; block 16, sinks 0, C 100
  memory::HeadWindows mixed{{1, {memory::kFullWindow, 10}}, {3, {10, 10}}};
  // full: 112 slots * 64 = 7168; window 10: 16 slots * 64 = 1024
  CHECK(memory::estimate(spec, mixed, opts(100)).components.global_kv_bytes == 7168 + 3 * 1024);
  CHECK(memory::head_bytes(*spec.layer(1).attention, 10, opts(100, 2)) == 2 * 1024);
}

TEST_CASE("state dtype override applies to every state", "[memory]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  auto o = opts(100);
  o.state_dtype = DType::kFloat32;
  // conv 192*4*4 = 3072 + ssm 8192, two mamba layers
  CHECK(memory::estimate(spec, memory::full_kv_windows(spec), o).components.ssm_state_bytes ==
        2 * (3072 + 8192));
}

TEST_CASE("sliding layers hold min(window, C) block-rounded (gpt-oss tiny)", "[memory]") {
  const auto spec = spec_from_config("gpt_oss_tiny.json");
  // sliding layer 0: window 4 → 16 slots * 2 heads * 16 * 2 * 2 = 2048
  CHECK(
      memory::estimate(spec, memory::full_kv_windows(spec), opts(100)).components.local_kv_bytes ==
      2048);
  // unpaged, context 3: 3 slots * 2 * 16 * 4 = 384
  CHECK(memory::estimate(spec, memory::full_kv_windows(spec), opts(3, 1, 1))
            .components.local_kv_bytes == 384);
  // the window policy never touches sliding layers
  CHECK(memory::estimate(spec, memory::uniform_windows(spec, 8), opts(100))
            .components.local_kv_bytes == 2048);
}

TEST_CASE("short conv, mamba1, falcon-h1 and mlp-only layers", "[memory]") {
  // lfm2: 3 conv layers * 64 * 3 * 2 B = 1152 other_state; 1 global layer
  const auto lfm2 = memory::estimate(
      spec_from_config("lfm2_tiny.json"),
      memory::uniform_windows(spec_from_config("lfm2_tiny.json"), 16), opts(64, 1, 1));
  CHECK(lfm2.components.other_state_bytes == 1152);
  CHECK(lfm2.components.global_kv_bytes == 2 * 16 * 64);
  // jamba: 3 mamba1 layers * (128*4*2 + 128*8*4) = 3 * 5120
  const auto jamba_spec = spec_from_config("jamba_tiny.json");
  CHECK(memory::estimate(jamba_spec, memory::full_kv_windows(jamba_spec), opts(16))
            .components.ssm_state_bytes == 15360);
  // falcon-h1: every layer KV + (96*4*2 + 4*16*8*4) = 768 + 2048 states
  const auto falcon = spec_from_config("falcon_h1_tiny.json");
  const auto fe = memory::estimate(falcon, memory::full_kv_windows(falcon), opts(32, 1, 16));
  CHECK(fe.components.ssm_state_bytes == 2 * 2816);
  CHECK(fe.components.global_kv_bytes == 2 * 2 * 32 * 64);
  CHECK(fe.layers[0].kv_bytes == 2 * 32 * 64);
  CHECK(fe.layers[0].state_bytes == 2816);
  // nemotron_h: MLP/MoE blocks hold nothing
  const auto nem = spec_from_config("nemotron_h_tiny.json");
  const auto ne = memory::estimate(nem, memory::full_kv_windows(nem), opts(16));
  CHECK(ne.layers[1].bytes == 0);
  CHECK(ne.layers[4].bytes == 0);
  // mamba: conv (64 + 2*2*16)*4*2 = 1024 + ssm 8*8*16*4 = 4096
  CHECK(ne.layers[0].bytes == 5120);
}

TEST_CASE("capacity: binary search equals brute force", "[memory]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  const memory::HeadWindows windows{{1, {memory::kFullWindow, 8}}, {3, {16, memory::kFullWindow}}};
  for (int64_t block : {1, 16}) {
    for (int64_t budget : {20000, 40000, 60000, 123456}) {
      auto o = opts(64, 1, block, 2);
      int64_t brute = 0;
      for (int64_t c = 1; c <= 4096; ++c) {
        auto oc = o;
        oc.context = c;
        if (memory::estimate(spec, windows, oc).total_bytes <= budget) brute = c;
      }
      const auto cap = memory::capacity(spec, windows, o, budget);
      INFO("block " << block << " budget " << budget);
      REQUIRE(cap.max_context.has_value());
      CHECK(*cap.max_context == brute);
      CHECK(cap.max_batch == budget / memory::estimate(spec, windows, o).total_bytes);
    }
  }
  // all windows finite: the cache stops growing, every context fits a large enough budget
  const auto finite = memory::capacity(spec, memory::uniform_windows(spec, 8), opts(64), 1 << 20);
  CHECK(!finite.max_context.has_value());
  CHECK(memory::capacity(spec, windows, opts(64), 100).max_context == 0);
  CHECK(memory::capacity(spec, windows, opts(64), -5).max_batch == 0);
}

TEST_CASE("bad options and windows name the flag or layer", "[memory]") {
  const auto spec = spec_from_config("bamba_tiny.json");
  const auto full = memory::full_kv_windows(spec);
  CHECK_THROWS_WITH(memory::estimate(spec, full, opts(0)), Catch::Contains("--context"));
  CHECK_THROWS_WITH(memory::estimate(spec, full, opts(10, -1)), Catch::Contains("--batch"));
  CHECK_THROWS_WITH(memory::estimate(spec, full, opts(10, 1, 0)), Catch::Contains("--block-size"));
  CHECK_THROWS_WITH(memory::estimate(spec, full, opts(10, 1, 16, -2)),
                    Catch::Contains("--sink-tokens"));
  CHECK_THROWS_WITH(memory::estimate(spec, full, opts(10, 1, 16, 0, DType::kInt8)),
                    Catch::Contains("--kv-dtype"));
  CHECK_THROWS_WITH(
      memory::estimate(spec,
                       memory::HeadWindows{{1, {memory::kFullWindow, memory::kFullWindow}},
                                           {2, {memory::kFullWindow, memory::kFullWindow}},
                                           {3, {memory::kFullWindow, memory::kFullWindow}}},
                       opts(10)),
      Catch::Contains("layer 2"));
  CHECK_THROWS_WITH(
      memory::estimate(
          spec,
          memory::HeadWindows{{1, {memory::kFullWindow, memory::kFullWindow, memory::kFullWindow}},
                              {3, {memory::kFullWindow, memory::kFullWindow}}},
          opts(10)),
      Catch::Contains("layer 1") && Catch::Contains("3 KV head windows"));
  CHECK_THROWS_WITH(memory::estimate(spec, memory::HeadWindows{{1, {0, 0}}}, opts(10)),
                    Catch::Contains("layer 3"));
  CHECK_THROWS_AS(memory::estimate(spec, full, opts(int64_t{1} << 62, 1 << 20)), InputError);
}

// These need the qwen3_next / gemma3_text spec builders (branches qwen, gemma); on a branch
// without one the case says so and checks nothing else.
TEST_CASE("Qwen3-Next-80B-A3B at 128K: full KV vs uniform windows", "[memory]") {
  if (arch::ArchitectureRegistry::instance().find("qwen3_next") == nullptr) {
    WARN("qwen3_next spec builder is not on this branch yet");
    return;
  }
  const auto o = opts(131072);
  const auto qwen = spec_from_config("qwen3_next_80b_a3b.json");
  // 12 global layers * 2 KV heads * 256 * 2 * 2 B = 24 KiB / token; 36 GDN layers * (conv 8192*4*2
  // + 32*128*128*4)
  const int64_t states = 36 * (8192 * 4 * 2 + 32 * 128 * 128 * 4);
  CHECK(memory::full_kv_bytes(qwen, o) == int64_t{24576} * 131072 + states);
  const auto u4k = memory::estimate(qwen, memory::uniform_windows(qwen, 4096), o);
  CHECK(u4k.total_bytes == int64_t{24576} * 4096 + states);
  CHECK(u4k.components.linear_state_bytes == states);
  CHECK(memory::estimate(qwen, memory::uniform_windows(qwen, 16384), o).total_bytes ==
        int64_t{24576} * 16384 + states);
}

TEST_CASE("Gemma-3-27B at 128K: full KV vs uniform windows", "[memory]") {
  if (arch::ArchitectureRegistry::instance().find("gemma3_text") == nullptr) {
    WARN("gemma3_text spec builder is not on this branch yet");
    return;
  }
  const auto o = opts(131072);
  const auto gemma = spec_from_config("gemma3_27b.json");
  // 10 global layers * 16 KV heads * 128 * 2 * 2 B = 80 KiB / token; 52 sliding layers hold
  // 1024 slots (window 1024, or 1023 rounded up to block 16) * 16 * 128 * 4 B
  const int64_t sliding = int64_t{52} * 1024 * 8192;
  CHECK(memory::full_kv_bytes(gemma, o) == int64_t{81920} * 131072 + sliding);
  const auto u4k = memory::estimate(gemma, memory::uniform_windows(gemma, 4096), o);
  CHECK(u4k.total_bytes == int64_t{81920} * 4096 + sliding);
  CHECK(u4k.components.local_kv_bytes == sliding);
}
