#pragma once
// Pieces of the hidden `headwise-calc bench-calib` command (tools/bench-calib runs it).
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>

namespace headwise::cli::bench {

// Waits for queued device work (CUDA work is asynchronous; host clocks need it finished).
void synchronize(const at::Device& device);

// Best (smallest) wall time in milliseconds of `repeats` runs of fn, each synchronised.
double best_ms(const at::Device& device, int repeats, const std::function<void()>& fn);

struct AttentionBenchShape {
  int64_t batch = 1, heads = 8, kv_heads = 2, steps = 8192, head_dim = 64;
  int64_t chunk = 512;
  int repeats = 1;
};

// Times the 5-level ladder 256,1k,2k,4k,full three ways on random inputs on `device`:
// five masked windowed_attention calls, one for_each_chunk_levels pass, and one
// measure_window_distortion pass (one-pass attention plus the per-head error projections).
// Keys: multiwindow_speedup (masked / one-pass), masked_ms, onepass_ms, measure_ms, ...
nlohmann::json bench_multiwindow(const AttentionBenchShape& shape, const at::Device& device,
                                 at::ScalarType dtype);

}  // namespace headwise::cli::bench
