// Multi-window attention timing for `headwise-calc bench-calib`.
#include <c10/core/InferenceMode.h>

#include <cmath>

#ifdef HEADWISE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "bench.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/arch/attention_cuda.hpp"
#include "headwise/measure/multiwindow.hpp"

namespace headwise::cli::bench {

void synchronize(const at::Device& device) {
#ifdef HEADWISE_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

double best_ms(const at::Device& device, int repeats, const std::function<void()>& fn) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    fn();
    synchronize(device);
    best = std::min(
        best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
  }
  return best;
}

nlohmann::json bench_multiwindow(const AttentionBenchShape& s, const at::Device& device,
                                 at::ScalarType dtype) {
  c10::InferenceMode inference;
  at::manual_seed(0);
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  arch::AttentionInputs in;
  // Random data, not zeros (zeros hide indexing bugs and can run faster than real data).
  in.q = at::randn({s.batch, s.heads, s.steps, s.head_dim}, opts);
  in.k = at::randn({s.batch, s.kv_heads, s.steps, s.head_dim}, opts);
  in.v = at::randn({s.batch, s.kv_heads, s.steps, s.head_dim}, opts);
  in.scaling = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  const int64_t hidden = 4 * s.heads * s.head_dim / s.kv_heads;  // a GQA-like Wo: hidden > g*hd
  in.o_proj_weight = at::randn({hidden, s.heads * s.head_dim}, opts) * 0.02;
  const auto ladder = measure::parse_window_ladder("256,1k,2k,4k,full", "bench");

  // Warm-up: first calls pay for allocator growth and (on CUDA) module load.
  measure::for_each_chunk_levels(in, ladder, 0, s.chunk,
                                 [](int64_t, int64_t, const auto&, const auto&) {});
  const double masked = best_ms(device, s.repeats, [&] {
    for (int64_t w : ladder.levels)
      (void)arch::windowed_attention(in, w, /*sink_tokens=*/0, s.chunk);
  });
  const double onepass = best_ms(device, s.repeats, [&] {
    measure::for_each_chunk_levels(in, ladder, 0, s.chunk,
                                   [](int64_t, int64_t, const auto&, const auto&) {});
  });
  const double measure_ms = best_ms(device, s.repeats, [&] {
    measure::DistortionAccumulator acc(s.kv_heads, static_cast<int64_t>(ladder.size()));
    (void)measure::measure_window_distortion(in, ladder, 0, s.chunk, acc);
  });
  const double full_ms = best_ms(
      device, s.repeats, [&] { (void)arch::windowed_attention(in, kFullWindow, 0, s.chunk); });
  nlohmann::json aten;
#ifdef HEADWISE_WITH_CUDA
  if (device.is_cuda()) {
    // The same calls through the ATen path (cuBLAS products, masked softmax), for comparison.
    arch::set_cuda_kernels_enabled(false);
    aten["aten_multiwindow_masked_ms"] = best_ms(device, s.repeats, [&] {
      for (int64_t w : ladder.levels) (void)arch::windowed_attention(in, w, 0, s.chunk);
    });
    aten["aten_multiwindow_onepass_ms"] = best_ms(device, s.repeats, [&] {
      measure::for_each_chunk_levels(in, ladder, 0, s.chunk,
                                     [](int64_t, int64_t, const auto&, const auto&) {});
    });
    aten["aten_full_attention_ms"] = best_ms(
        device, s.repeats, [&] { (void)arch::windowed_attention(in, kFullWindow, 0, s.chunk); });
    arch::set_cuda_kernels_enabled(true);
  }
#endif
  nlohmann::json result = {{"multiwindow_speedup", masked / onepass},
                           {"multiwindow_over_full_attention", onepass / full_ms},
                           {"multiwindow_measure_speedup", masked / measure_ms},
                           {"multiwindow_levels", ladder.to_string()},
                           {"multiwindow_masked_ms", masked},
                           {"multiwindow_onepass_ms", onepass},
                           {"multiwindow_measure_ms", measure_ms},
                           {"full_attention_ms", full_ms},
                           {"multiwindow_shape",
                            {{"batch", s.batch},
                             {"heads", s.heads},
                             {"kv_heads", s.kv_heads},
                             {"steps", s.steps},
                             {"head_dim", s.head_dim},
                             {"chunk", s.chunk},
                             {"dtype", c10::toString(dtype)}}}};
  if (!aten.is_null()) result.update(aten);
  return result;
}

}  // namespace headwise::cli::bench
