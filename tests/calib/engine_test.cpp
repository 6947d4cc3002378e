// Calibrating in vLLM's bytes (calib/engine.hpp, memory::vllm_head_bytes): each head's price at
// every level by the window + max_num_batched_tokens rule and vLLM's block, never above full; the
// policy fitted to the budget in vLLM's exact reservation; the keep rules and sinks vLLM serves;
// the notice when vLLM runs with other parameters than the policy's.
#include <catch2/catch.hpp>

#include <filesystem>

#include "headwise/arch/registry.hpp"
#include "headwise/calib/engine.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/vllm_model.hpp"
#include "headwise/policy/policy.hpp"
#include "support/test_paths.hpp"

using namespace headwise;
using calib::EngineBytes;
using calib::ServingEngine;

namespace {

arch::ModelSpec fixture(const char* name) {
  return arch::load_model_spec(std::filesystem::path(HEADWISE_FIXTURES_DIR) / name);
}

memory::MemoryOptions serving(int64_t context, int64_t block = 128) {
  memory::MemoryOptions o;
  o.context = context;
  o.block_size = block;
  o.kv_dtype = DType::kFloat32;
  o.state_dtype = DType::kFloat32;
  return o;
}

memory::VllmOptions chunk(int64_t tokens) {
  memory::VllmOptions v;
  v.max_num_batched_tokens = tokens;
  return v;
}

// Curves for every global head at `ladder`: a head's distortion falls with its window, and heads
// differ (head h of the i-th global layer costs (1 + h + 4i) per level below full).
std::vector<calib::HeadCurve> curves_for(const arch::ModelSpec& spec, const EngineBytes& bytes,
                                         const std::vector<int64_t>& ladder) {
  std::vector<calib::HeadCurve> out;
  int64_t i = 0;
  for (int64_t id : spec.global_layer_ids()) {
    const auto& layer = spec.layer(id);
    for (int64_t h = 0; h < layer.attention->num_kv_heads; ++h) {
      calib::HeadCurve c{id, h, {}, {}, {}};
      for (size_t l = 0; l < ladder.size(); ++l) {
        c.windows.push_back(ladder[l]);
        c.bytes.push_back(bytes.head(layer, ladder[l]));
        c.distortion.push_back(static_cast<double>((ladder.size() - 1 - l) * (1 + h + 4 * i)));
      }
      out.push_back(std::move(c));
    }
    ++i;
  }
  return out;
}

memory::HeadWindows uniform(const arch::ModelSpec& spec, int64_t w) {
  return memory::uniform_windows(spec, w);
}

std::map<int64_t, std::vector<double>> zeros(const memory::HeadWindows& w) {
  std::map<int64_t, std::vector<double>> out;
  for (const auto& [id, heads] : w) out[id].assign(heads.size(), 0.0);
  return out;
}

}  // namespace

TEST_CASE("vLLM head price: window + max_num_batched_tokens, vLLM's block, never above full",
          "[calib]") {
  const auto spec = fixture("gemma3_vllm");  // 4 layers, global 1 and 3, 4 KV heads of 32
  const auto& layer = spec.layer(1);
  const int64_t page = 128 * 32 * 2 * 4;  // one head's page at block 128, float32 K and V
  const auto o8k = serving(8192);
  // window 64: cdiv(min(63 + 2048, 8192), 128) + 1 = 17 + 1 pages; full: 64 pages
  REQUIRE(memory::vllm_head_bytes(spec, layer, 64, o8k, chunk(2048)) == 18 * page);
  REQUIRE(memory::vllm_head_bytes(spec, layer, 1024, o8k, chunk(2048)) == 25 * page);
  REQUIRE(memory::vllm_head_bytes(spec, layer, memory::kFullWindow, o8k, chunk(2048)) == 64 * page);
  REQUIRE_FALSE(memory::vllm_serves_as_full(spec, layer, 1024, o8k, chunk(2048)));
  // At 2K with a 2048-token chunk every window reserves 2048 tokens + a block: priced as full.
  const auto o2k = serving(2048);
  for (int64_t w : {64, 256, 1024}) {
    REQUIRE(memory::vllm_head_bytes(spec, layer, w, o2k, chunk(2048)) == 16 * page);
    REQUIRE(memory::vllm_serves_as_full(spec, layer, w, o2k, chunk(2048)));
  }
  // The fixed part: the two sliding layers (window 64) at 18 pages of 4 heads each.
  REQUIRE(memory::vllm_fixed_bytes(spec, o8k, chunk(2048)) == 2 * 18 * 4 * page);
  // The headwise engine keeps its own rates.
  const EngineBytes headwise(spec, o8k, ServingEngine::kHeadwise);
  REQUIRE(headwise.head(layer, 64) == memory::head_bytes(*layer.attention, 64, o8k));
}

TEST_CASE(
    "vLLM fit: the policy fits the budget in vLLM's exact reservation, never worse than "
    "full",
    "[calib]") {
  const std::vector<int64_t> ladder = {64, 256, 1024, memory::kFullWindow};
  for (const char* name : {"gemma3_vllm", "qwen3_next_vllm"}) {
    const auto spec = fixture(name);
    for (int64_t context : {2048, 4096, 8192}) {
      const EngineBytes bytes(spec, serving(context), ServingEngine::kVllm, chunk(2048));
      const auto curves = curves_for(spec, bytes, ladder);
      const int64_t full = bytes.full();
      const int64_t fixed = bytes.fixed();
      CAPTURE(name, context, full, fixed);
      // Budgets from the cheapest policy to full KV, halving the global part on the way.
      const int64_t minimum = bytes.minimum(ladder);
      REQUIRE(minimum <= full);
      for (int64_t budget :
           {minimum, fixed + (full - fixed) / 2, fixed + 3 * (full - fixed) / 4, full, full + 1}) {
        if (budget < minimum) continue;
        // From the walk's cheapest and from full KV: the fit moves whichever way it must.
        for (int64_t start : {int64_t{64}, memory::kFullWindow}) {
          const auto w = uniform(spec, start);
          const auto fit = calib::fit_to_engine(bytes, curves, w, zeros(w), budget);
          CAPTURE(budget, start);
          REQUIRE(fit.total_bytes == bytes.total(fit.windows));
          REQUIRE(fit.total_bytes <= budget);
          REQUIRE(fit.total_bytes <= full);
          for (const auto& [id, heads] : fit.windows)
            for (int64_t win : heads)
              REQUIRE((win == memory::kFullWindow ||
                       !memory::vllm_serves_as_full(spec, spec.layer(id), win, serving(context),
                                                    chunk(2048))));
        }
      }
      if (minimum == full) {
        // Nothing saves bytes (2K contexts at a 2048-token chunk): a budget below full is refused.
        const auto w = uniform(spec, 64);
        REQUIRE_THROWS_AS(calib::fit_to_engine(bytes, curves, w, zeros(w), full - 1),
                          InfeasibleFieldError);
      }
    }
  }
}

TEST_CASE("vLLM: only window rules and no sinks; one-line errors name the flag", "[calib]") {
  using calib::engine_keep_rules;
  const auto tv = calib::DistortionMeasure::kAnswerTvSpan;
  REQUIRE(engine_keep_rules("auto", tv, ServingEngine::kVllm) == "window");
  REQUIRE(engine_keep_rules("window", tv, ServingEngine::kVllm) == "window");
  REQUIRE(engine_keep_rules("auto", tv, ServingEngine::kHeadwise) == "window,h2o");
  try {
    engine_keep_rules("window,h2o", tv, ServingEngine::kVllm);
    FAIL("h2o accepted with --engine vllm");
  } catch (const FieldError& e) {
    REQUIRE(e.field() == "keep_rules");
    REQUIRE(std::string(e.what()).find("--keep-rules") != std::string::npos);
    REQUIRE(std::string(e.what()).find('\n') == std::string::npos);
  }
  auto o = serving(4096);
  o.sink_tokens = 4;
  try {
    calib::check_engine_options(ServingEngine::kVllm, o, chunk(2048));
    FAIL("sinks accepted with --engine vllm");
  } catch (const FieldError& e) {
    REQUIRE(e.field() == "sink_tokens");
  }
  REQUIRE_NOTHROW(calib::check_engine_options(ServingEngine::kHeadwise, o, chunk(2048)));
  try {
    calib::check_engine_options(ServingEngine::kVllm, serving(4096), chunk(0));
    FAIL("max_num_batched_tokens 0 accepted");
  } catch (const FieldError& e) {
    REQUIRE(e.field() == "max_num_batched_tokens");
  }
  try {
    calib::parse_serving_engine("sglang");
    FAIL("an unknown engine accepted");
  } catch (const FieldError& e) {
    REQUIRE(e.field() == "engine");
  }
}

TEST_CASE("vLLM: the policy records the engine; the notice names parameters that differ",
          "[calib]") {
  policy::Policy p;
  p.model_name = "m";
  p.context = 8192;
  p.block_size = 128;
  p.dtype = DType::kFloat32;
  p.window_levels = {64, memory::kFullWindow};
  p.per_layer_policies = {{1, {64, memory::kFullWindow}, {}, {}}};
  REQUIRE_FALSE(calib::engine_parameters_notice(p, serving(8192), chunk(4096)));  // no record
  p.engine = policy::EngineRecord{"vllm", "0.25.1", 2048, "none", 128, 123, 456};
  REQUIRE_FALSE(calib::engine_parameters_notice(p, serving(8192), chunk(2048)));
  const auto notice = calib::engine_parameters_notice(p, serving(8192, 16), chunk(8192));
  REQUIRE(notice);
  CAPTURE(*notice);
  REQUIRE(notice->find("max_num_batched_tokens 2048") != std::string::npos);
  REQUIRE(notice->find("max_num_batched_tokens 8192") != std::string::npos);
  REQUIRE(notice->find("block_size 16") != std::string::npos);
  REQUIRE(notice->find('\n') == std::string::npos);

  const std::string yaml = policy::to_yaml(p);
  REQUIRE(yaml.find("engine:") != std::string::npos);
  const policy::Policy back = policy::from_yaml(yaml, "<test>");
  REQUIRE(back.engine);
  REQUIRE(back.engine->max_num_batched_tokens == 2048);
  REQUIRE(back.engine->total_bytes == 123);
  REQUIRE(back.engine->full_kv_total_bytes == 456);
  REQUIRE(policy::to_yaml(back) == yaml);
  // Without the record nothing is written: every other policy stays byte-identical.
  p.engine.reset();
  REQUIRE(policy::to_yaml(p).find("engine:") == std::string::npos);
  std::string bad = yaml;
  bad.replace(bad.find("name: vllm"), 10, "name: sglang");
  REQUIRE_THROWS_AS(policy::from_yaml(bad, "<test>"), InputError);
}
