// One definition of a window (arch/visible_keys.hpp), one table of cases, every attention path
// held to it: the tensor mask, the forward's windowed attention (any query chunk, with and without
// gpt-oss sink logits), the calibration's multi-window bands, the runtime's fused kernel over
// shuffled key sets, the runtime's ring buffers fed in uneven chunks (global heads with mixed
// windows and sinks, and a sliding layer; fused and explicit attention), and the CUDA
// kernel where a GPU is present. The reference is a brute-force loop over key_visible in double.
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "../support/skip.hpp"
#include "../test_configs.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/measure/multiwindow.hpp"
#include "headwise/measure/window_ladder.hpp"
#include "headwise/runtime/decoder.hpp"
#include "headwise/runtime/grouped_cache.hpp"

using namespace headwise;

namespace {

constexpr int64_t F = kFullWindow;

struct Case {
  std::vector<int64_t> windows;  // per KV head
  int64_t sinks = 0;
};

// Windows of 1 (only the query itself), shorter and longer than the sequence, equal to it, and
// sinks inside and beyond some windows.
const std::vector<Case> kCases{
    {{1, 1}, 0},   {{3, F}, 0}, {{5, 2}, 2},   {{F, F}, 3},
    {{22, 23}, 0}, {{4, 7}, 1}, {{100, 4}, 5}, {{1, 6}, 4},
};
constexpr int64_t kSteps = 23;

at::Tensor random(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kFloat);
}

// [B, T, H, hd]: softmax over the visible keys (plus the sink logit), in double, query by query.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<int64_t>& windows, int64_t sinks, double scaling,
                               const at::Tensor& sink_logits, int64_t position_offset = 0) {
  const int64_t batch = q.size(0), heads = q.size(1), steps = q.size(2), hd = q.size(3),
                kv = k.size(1);
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  at::Tensor out = at::zeros({batch, steps, heads, hd}, at::kDouble);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kv);
      for (int64_t i = 0; i < steps; ++i) {
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < steps; ++j) {
          if (arch::key_visible(position_offset + i, position_offset + j,
                                windows[static_cast<size_t>(g)], sinks)) {
            keys.push_back(j);
          }
        }
        const at::Tensor idx = at::tensor(keys, at::kLong);
        at::Tensor logits = (kd[b][g].index_select(0, idx).matmul(qd[b][h][i])) * scaling;
        if (sink_logits.defined())
          logits = at::cat({logits, sink_logits.to(at::kDouble)[h].view({1})});
        const at::Tensor p = at::softmax(logits, 0).slice(0, 0, static_cast<int64_t>(keys.size()));
        out[b][i][h] = p.matmul(vd[b][g].index_select(0, idx));
      }
    }
  }
  return out.to(at::kFloat);
}

arch::AttentionInputs inputs(int64_t heads, int64_t kv, int64_t hd, uint64_t seed) {
  arch::AttentionInputs in;
  in.q = random({1, heads, kSteps, hd}, seed);
  in.k = random({1, kv, kSteps, hd}, seed + 1);
  in.v = random({1, kv, kSteps, hd}, seed + 2);
  in.scaling = 1.0 / std::sqrt(static_cast<double>(hd));
  return in;
}

std::vector<int64_t> cycled(const std::vector<int64_t>& windows, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t h = 0; h < n; ++h) out.push_back(windows[static_cast<size_t>(h) % windows.size()]);
  return out;
}

}  // namespace

TEST_CASE("visible keys: the tensor mask is the scalar rule", "[arch]") {
  const at::Tensor q = at::arange(40, 60, at::kLong), k = at::arange(0, 70, at::kLong);
  for (const auto& c : kCases) {
    for (int64_t w : c.windows) {
      const at::Tensor mask = arch::visible_keys(q, k, w, c.sinks);
      REQUIRE(mask.sizes().vec() == std::vector<int64_t>{20, 70});
      for (int64_t i = 0; i < 20; ++i) {
        for (int64_t j = 0; j < 70; ++j) {
          INFO("w " << w << " sinks " << c.sinks << " q " << 40 + i << " k " << j);
          CHECK(mask[i][j].item<bool>() == arch::key_visible(40 + i, j, w, c.sinks));
        }
      }
    }
  }
  // The rule itself, spelled out once: the query's own key is always visible, the future never.
  STATIC_REQUIRE(arch::key_visible(7, 7, 1, 0));
  STATIC_REQUIRE_FALSE(arch::key_visible(7, 6, 1, 0));
  STATIC_REQUIRE(arch::key_visible(7, 5, 3, 0));
  STATIC_REQUIRE_FALSE(arch::key_visible(7, 4, 3, 0));
  STATIC_REQUIRE(arch::key_visible(7, 1, 3, 2));        // a sink
  STATIC_REQUIRE_FALSE(arch::key_visible(1, 2, F, 5));  // sinks never reveal the future
}

TEST_CASE("visible keys: windowed attention, any chunk, with and without sink logits", "[arch]") {
  uint64_t seed = 10;
  for (const auto& c : kCases) {
    auto in = inputs(4, 2, 8, seed += 3);
    for (bool with_sink_logits : {false, true}) {
      in.sink_logits = with_sink_logits ? random({4}, seed + 7) : at::Tensor();
      const at::Tensor want =
          reference_attention(in.q, in.k, in.v, c.windows, c.sinks, in.scaling, in.sink_logits);
      for (int64_t chunk : {1, 4, 64}) {
        INFO("windows " << c.windows[0] << "," << c.windows[1] << " sinks " << c.sinks << " chunk "
                        << chunk << " sink logits " << with_sink_logits);
        const at::Tensor got = arch::windowed_attention(in, c.windows, c.sinks, chunk);
        CHECK(at::allclose(got, want, 1e-5, 1e-5));
      }
    }
  }
}

TEST_CASE("visible keys: the fused windowed attention, values and gradients", "[arch]") {
  uint64_t seed = 30;
  for (const auto& c : kCases) {
    for (int64_t w : c.windows) {
      auto in = inputs(4, 2, 8, seed += 3);
      const at::Tensor want =
          reference_attention(in.q, in.k, in.v, {w, w}, c.sinks, in.scaling, at::Tensor());
      for (int64_t chunk : {1, 4, 64}) {
        INFO("window " << w << " sinks " << c.sinks << " chunk " << chunk);
        CHECK(
            at::allclose(arch::fused_windowed_attention(in, w, c.sinks, chunk), want, 1e-5, 1e-5));
      }
      // duo trains through it: its gradients are the explicit path's.
      const c10::InferenceMode not_inference(false);
      const at::AutoGradMode grad(true);
      std::vector<at::Tensor> grads;
      for (bool fused : {true, false}) {
        arch::AttentionInputs leaf = in;
        leaf.q = in.q.clone().requires_grad_(true);
        leaf.k = in.k.clone().requires_grad_(true);
        leaf.v = in.v.clone().requires_grad_(true);
        const at::Tensor out = fused ? arch::fused_windowed_attention(leaf, w, c.sinks, 4)
                                     : arch::windowed_attention(leaf, w, c.sinks, 4);
        const at::Tensor cotangent = at::cos(at::arange(out.numel(), at::kFloat)).view(out.sizes());
        const auto g = torch::autograd::grad({out}, {leaf.q, leaf.k, leaf.v}, {cotangent});
        grads.insert(grads.end(), g.begin(), g.end());
      }
      for (size_t i = 0; i < 3; ++i) CHECK(at::allclose(grads[i], grads[i + 3], 1e-5, 1e-5));
    }
  }
}

TEST_CASE("visible keys: the multi-window bands give each level's window", "[arch][measure]") {
  uint64_t seed = 40;
  for (const auto& c : kCases) {
    const auto in = inputs(4, 2, 8, seed += 3);
    std::set<int64_t> levels(c.windows.begin(), c.windows.end());
    levels.insert(F);
    std::vector<std::string> names;
    for (int64_t w : levels) names.push_back(w == F ? "full" : std::to_string(w));
    const auto ladder =
        measure::parse_window_ladder(fmt::format("{}", fmt::join(names, ",")), "test");
    for (int64_t chunk : {3, 64}) {
      const at::Tensor all =
          measure::all_window_outputs(in, ladder, c.sinks, chunk);  // [levels, B, T, H, hd]
      for (size_t l = 0; l < ladder.levels.size(); ++l) {
        const int64_t w = ladder.levels[l];
        INFO("level " << w << " sinks " << c.sinks << " chunk " << chunk);
        const at::Tensor want =
            reference_attention(in.q, in.k, in.v, {w, w}, c.sinks, in.scaling, at::Tensor());
        CHECK(at::allclose(all[static_cast<int64_t>(l)], want, 1e-5, 1e-5));
      }
    }
  }
}

TEST_CASE("visible keys: the runtime's fused kernel over explicit key sets", "[arch][runtime]") {
  // Keys in a shuffled order with scattered positions, as a ring buffer holds them.
  uint64_t seed = 60;
  for (const auto& c : kCases) {
    const auto in = inputs(4, 2, 8, seed += 3);
    const at::Tensor want =
        reference_attention(in.q, in.k, in.v, c.windows, c.sinks, in.scaling, at::Tensor());
    const at::Tensor order = at::randperm(kSteps, at::TensorOptions().dtype(at::kLong));
    const at::Tensor positions = at::arange(kSteps, at::kLong).index_select(0, order);
    at::Tensor got = at::empty({1, 2, 2, kSteps, 8});
    for (int64_t h = 0; h < 2; ++h) {
      const at::Tensor allowed =
          arch::visible_keys(at::arange(kSteps, at::kLong), positions, c.windows[h], c.sinks);
      got.select(1, h).copy_(arch::fused_masked_attention(
          in.q.view({1, 2, 2, kSteps, 8}).select(1, h),
          in.k.slice(1, h, h + 1).index_select(2, order),
          in.v.slice(1, h, h + 1).index_select(2, order), allowed, in.scaling));
    }
    INFO("windows " << c.windows[0] << "," << c.windows[1] << " sinks " << c.sinks);
    CHECK(at::allclose(got.view({1, 4, kSteps, 8}).transpose(1, 2), want, 1e-5, 1e-5));
  }
}

TEST_CASE("visible keys: the runtime's ring buffers, fed in uneven chunks", "[arch][runtime]") {
  // gpt-oss: a sliding layer (window 4, its own ring) and a global layer; with its sink logits
  // (the explicit path) and without them (the fused kernel, or the explicit path when asked).
  const auto spec = headwise::testing::spec_from_config("gpt_oss_tiny.json");
  const int64_t global = spec.global_layer_ids().front();
  int64_t sliding = -1;
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    if (spec.layer(i).attention && spec.layer(i).attention->sliding_window > 0) sliding = i;
  }
  REQUIRE(sliding >= 0);
  const auto& att = *spec.layer(global).attention;
  uint64_t seed = 70;
  for (const auto& c : kCases) {
    memory::MemoryOptions o;
    o.context = kSteps;
    o.block_size = 16;
    o.sink_tokens = c.sinks;
    o.kv_dtype = DType::kFloat32;
    const auto windows = cycled(c.windows, att.num_kv_heads);
    for (const auto& [with_sink_logits, kernel] :
         std::vector<std::pair<bool, arch::AttentionKernel>>{
             {true, arch::AttentionKernel::kFused},
             {false, arch::AttentionKernel::kFused},
             {false, arch::AttentionKernel::kExplicit}}) {
      runtime::GroupedCache cache = runtime::GroupedCache::allocate(spec, {{global, windows}}, o);
      runtime::CachedAttentionCore core(spec, cache, /*query_chunk=*/2);
      core.set_kernel(kernel);
      for (int64_t layer : {global, sliding}) {
        const auto& a = *spec.layer(layer).attention;
        auto in = inputs(a.num_heads, a.num_kv_heads, a.head_dim, seed += 5);
        in.layer_id = layer;
        if (with_sink_logits) in.sink_logits = random({a.num_heads}, seed + 3);
        in.sliding_window = layer == sliding ? a.sliding_window : 0;
        const std::vector<int64_t> want_windows =
            layer == sliding ? cycled({a.sliding_window}, a.num_kv_heads) : windows;
        const int64_t want_sinks = layer == sliding ? 0 : c.sinks;
        // A full window ignores sinks; the rule already says so (every causal key is visible).
        const at::Tensor want = reference_attention(in.q, in.k, in.v, want_windows, want_sinks,
                                                    in.scaling, in.sink_logits);
        std::vector<at::Tensor> parts;
        int64_t t0 = 0;
        for (int64_t step : {1, 5, 2, 7, 3, 5}) {
          const int64_t t1 = std::min(kSteps, t0 + step);
          arch::AttentionInputs chunk = in;
          chunk.q = in.q.slice(2, t0, t1);
          chunk.k = in.k.slice(2, t0, t1);
          chunk.v = in.v.slice(2, t0, t1);
          chunk.position_offset = t0;
          parts.push_back(core.attend(chunk));
          t0 = t1;
        }
        REQUIRE(t0 == kSteps);
        INFO("layer " << layer << " windows " << c.windows[0] << "," << c.windows[1] << " sinks "
                      << c.sinks << " sink logits " << with_sink_logits << " explicit "
                      << (kernel == arch::AttentionKernel::kExplicit));
        CHECK(at::allclose(at::cat(parts, 1), want, 1e-5, 1e-5));
      }
    }
  }
}

TEST_CASE("visible keys: the CUDA kernel (where a GPU is present)", "[arch][gpu]") {
  if (!at::hasCUDA())
    HEADWISE_SKIP("no CUDA device: the kernel is checked by tools/gpu-check.sh on a GPU machine");
  uint64_t seed = 90;
  for (const auto& c : kCases) {
    auto in = inputs(4, 2, 32, seed += 3);  // head_dim a multiple of 32: the kernel's path
    const at::Tensor want =
        reference_attention(in.q, in.k, in.v, c.windows, c.sinks, in.scaling, at::Tensor());
    arch::AttentionInputs gpu = in;
    gpu.q = in.q.cuda();
    gpu.k = in.k.cuda();
    gpu.v = in.v.cuda();
    INFO("windows " << c.windows[0] << "," << c.windows[1] << " sinks " << c.sinks);
    CHECK(
        at::allclose(arch::windowed_attention(gpu, c.windows, c.sinks, 8).cpu(), want, 1e-4, 1e-4));
  }
}
