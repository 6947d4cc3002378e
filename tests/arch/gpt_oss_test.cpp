// gpt-oss: parity with transformers on a tiny random checkpoint (tools/fixtures/gpt_oss.py:
// sliding/full layers with sink logits, top-2 of 4 clamped-SwiGLU experts, YaRN), and the
// refusal of MXFP4-quantized experts.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>

#include "fixture_reference.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"

using namespace headwise;
using namespace headwise::testing;

TEST_CASE("gpt-oss matches transformers in fp32 and bf16", "[parity]") {
  const auto fixture = fixture_dir("gpt_oss_tiny");
  const auto fp32 = compare(run_fixture(fixture, {}), read_reference(fixture, "logits_fp32"));
  INFO("fp32 max abs err " << fp32.error << ", logit scale " << fp32.scale);
  CHECK(fp32.error <= 1e-4 * fp32.scale);
  arch::ModelOptions options;
  options.compute_dtype = DType::kBFloat16;
  // transformers' gpt-oss eager attention takes its softmax (with the sink) in bf16, ours in fp32
  // (as its Llama path does). That choice alone moves a few tokens a lot: transformers' own
  // forward with the softmax in fp32 differs from its bf16 one by 0.129 at sample 1, position 39,
  // exactly our largest difference (a top-2 expert choice within bf16 rounding of a tie). So: one
  // bf16 ulp of the scale at 95% of the positions and on average, and no position beyond 0.25.
  const at::Tensor ours = run_fixture(fixture, options);
  const at::Tensor theirs = read_reference(fixture, "logits_bf16");
  const auto bf16 = compare(ours, theirs);
  const at::Tensor per_position = (ours.to(at::kFloat) - theirs.to(at::kFloat)).abs().amax(-1);
  const double close = (per_position <= 4e-3 * bf16.scale).to(at::kFloat).mean().item<double>();
  INFO("bf16 max abs err " << bf16.error << ", logit scale " << bf16.scale << ", mean "
                           << per_position.mean().item<double>() << ", positions within one ulp "
                           << close);
  CHECK(close >= 0.95);
  CHECK(per_position.mean().item<double>() <= 4e-3 * bf16.scale);
  CHECK(bf16.error <= 0.25 * bf16.scale);
}

TEST_CASE("gpt-oss sinks, experts and sliding windows all matter in the fixture", "[parity]") {
  const auto fixture = fixture_dir("gpt_oss_tiny");
  const at::Tensor reference = read_reference(fixture, "logits_fp32");
  const auto differs = [&](const std::function<nlohmann::json(nlohmann::json)>& edit,
                           const std::function<bool(EditableTensor&)>& tensors = {}) {
    TempDir dir;
    copy_fixture(fixture, dir.path(), edit, tensors);
    const auto err = compare(run_fixture(fixture, {}, dir.path()), reference);
    return err.error > 1e-3 * err.scale;
  };
  const auto keep = [](nlohmann::json c) { return c; };
  CHECK(differs([](nlohmann::json c) {  // every layer global: the window of 8 was in force
    c["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
    return c;
  }));
  CHECK(differs([](nlohmann::json c) {  // top-1 routing
    c["num_experts_per_tok"] = 1;
    return c;
  }));
  CHECK(differs(keep, [](EditableTensor& t) {  // sinks at -inf-like: plain softmax
    if (t.name.find("self_attn.sinks") == std::string::npos) return true;
    REQUIRE(t.dtype == DType::kFloat32);  // the fixture is fp32
    const float silent = -1e4f;
    for (size_t at = 0; at + sizeof silent <= t.data.size(); at += sizeof silent)
      std::memcpy(&t.data[at], &silent, sizeof silent);
    return true;
  }));
}

TEST_CASE("gpt-oss MXFP4 experts are refused with the tensor named", "[arch]") {
  const auto fixture = fixture_dir("gpt_oss_tiny");
  TempDir dir;
  copy_fixture(
      fixture, dir.path(), [](nlohmann::json c) { return c; },
      [](EditableTensor& t) {
        if (t.name == "model.layers.0.mlp.experts.gate_up_proj")
          t.name = "model.layers.0.mlp.experts.gate_up_proj_blocks";
        return true;
      });
  require_load_error(dir.path(), {"MXFP4", "gate_up_proj_blocks", "dequantize"});
}
