// The CUDA kernel (src/arch/attention_cuda.cu) against the CPU path. Without a GPU every
// case skips (HEADWISE_SKIP: the [gpu] ctest entry then reports "skipped"); tools/gpu-check.sh
// runs them on the GPU machine.
#include <catch2/catch.hpp>

#include "../support/skip.hpp"

#include "headwise/arch/attention.hpp"
#include "headwise/measure/multiwindow.hpp"

using namespace headwise;

namespace {

constexpr const char* kNoGpu = "no CUDA device (tools/gpu-check.sh runs this on a GPU machine)";

struct Case {
  int64_t batch, heads, kv, steps, hd;
  at::ScalarType dtype;
  double softcap = 0.0;
  int64_t offset = 0;
};

// Fresh random inputs on the CPU in the case's dtype (so both paths see the same rounded
// values), with a scale that makes softmax neither uniform nor one-hot.
arch::AttentionInputs random_inputs(const Case& c, uint64_t seed) {
  at::manual_seed(seed);
  arch::AttentionInputs in;
  in.q = (at::randn({c.batch, c.heads, c.steps, c.hd}) * 2.0).to(c.dtype);
  in.k = (at::randn({c.batch, c.kv, c.steps, c.hd}) * 2.0).to(c.dtype);
  in.v = at::randn({c.batch, c.kv, c.steps, c.hd}).to(c.dtype);
  in.scaling = 1.0 / std::sqrt(static_cast<double>(c.hd));
  in.logit_softcap = c.softcap;
  in.position_offset = c.offset;
  in.o_proj_weight = (at::randn({48, c.heads * c.hd}) * 0.1).to(c.dtype);
  in.output_gate = at::sigmoid(at::randn({c.batch, c.steps, c.heads, c.hd})).to(c.dtype);
  return in;
}

arch::AttentionInputs to_cuda(arch::AttentionInputs in) {
  for (at::Tensor* t : {&in.q, &in.k, &in.v, &in.o_proj_weight, &in.output_gate})
    *t = t->to(at::kCUDA);
  return in;
}

arch::AttentionInputs to_float(arch::AttentionInputs in) {
  for (at::Tensor* t : {&in.q, &in.k, &in.v, &in.o_proj_weight, &in.output_gate})
    *t = t->to(at::kFloat);
  return in;
}

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  REQUIRE(at::isfinite(g).all().item<bool>());
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

const std::vector<Case> kCases = {
    {2, 6, 2, 50, 32, at::kFloat},            // several KV groups, tiny T
    {1, 8, 2, 300, 128, at::kFloat, 0.0, 5},  // many blocks, position offset
    {1, 4, 4, 130, 64, at::kBFloat16},        // MHA, bf16 loads
    {2, 4, 1, 97, 256, at::kHalf, 30.0},      // MQA, fp16, soft-capping, widest head
};

}  // namespace

TEST_CASE("CUDA multi-window levels equal the CPU path", "[gpu]") {
  if (!at::hasCUDA()) HEADWISE_SKIP(kNoGpu);
  const auto ladder = measure::parse_window_ladder("4,9,20,64,full", "test");
  uint64_t seed = 100;
  for (const auto& c : kCases) {
    for (int64_t sinks : {0, 3}) {
      for (int64_t chunk : {7, 64}) {
        const auto in = random_inputs(c, ++seed);
        const at::Tensor want = measure::all_window_outputs(to_float(in), ladder, sinks, chunk);
        const at::Tensor got = measure::all_window_outputs(to_cuda(in), ladder, sinks, chunk);
        INFO("hd " << c.hd << " dtype " << c10::toString(c.dtype) << " sinks " << sinks << " chunk "
                   << chunk);
        // Same rounded inputs, fp32 accumulation on both sides: only summation order differs.
        CHECK(rel_error(got, want) < 1e-4);
      }
    }
  }
}

TEST_CASE("CUDA windowed attention equals the masked reference", "[gpu]") {
  if (!at::hasCUDA()) HEADWISE_SKIP(kNoGpu);
  uint64_t seed = 200;
  for (const auto& c : kCases) {
    const auto in = random_inputs(c, ++seed);
    std::vector<int64_t> windows;
    for (int64_t h = 0; h < c.kv; ++h) windows.push_back(h % 2 == 0 ? 5 + 7 * h : kFullWindow);
    for (int64_t sinks : {0, 2}) {
      const at::Tensor want = arch::windowed_attention(to_float(in), windows, sinks, 1000);
      const at::Tensor got = arch::windowed_attention(to_cuda(in), windows, sinks, 512);
      INFO("hd " << c.hd << " dtype " << c10::toString(c.dtype) << " sinks " << sinks);
      CHECK(got.scalar_type() == c.dtype);
      CHECK(got.sizes() == want.sizes());
      // The output is rounded to the input dtype: bf16 keeps 8 bits of mantissa.
      CHECK(rel_error(got, want) < (c.dtype == at::kFloat ? 1e-4 : 1e-2));
    }
  }
}

TEST_CASE("CUDA distortion measurement equals the CPU measurement", "[gpu]") {
  if (!at::hasCUDA()) HEADWISE_SKIP(kNoGpu);
  const auto ladder = measure::parse_window_ladder("8,32,full", "test");
  uint64_t seed = 300;
  for (const auto& c : kCases) {
    const auto in = random_inputs(c, ++seed);
    measure::DistortionAccumulator cpu(c.kv, 3), gpu(c.kv, 3);
    const at::Tensor full_cpu =
        measure::measure_window_distortion(to_float(in), ladder, 2, 32, cpu);
    const at::Tensor full_gpu =
        measure::measure_window_distortion(to_cuda(to_float(in)), ladder, 2, 32, gpu);
    CHECK(rel_error(full_gpu, full_cpu) < 1e-4);
    for (int64_t h = 0; h < c.kv; ++h) {
      for (int64_t l = 0; l < 3; ++l) {
        INFO("hd " << c.hd << " head " << h << " level " << l);
        CHECK(gpu.distortion(h, l) == Approx(cpu.distortion(h, l)).epsilon(1e-3).margin(1e-9));
      }
    }
  }
}
