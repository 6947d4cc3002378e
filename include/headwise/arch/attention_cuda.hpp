#pragma once
// The CUDA attention kernels (src/arch/attention_cuda.cu), defined only when HEADWISE_WITH_CUDA
// is: per-KV-head windowed attention for the forward, and the multi-window pass the measurement
// (src/measure) builds on. They live with the attention they accelerate so measure/ depends on
// arch/ and never the other way. Callers check `cuda_multiwindow_supported` and fall back to the
// ATen path (which also runs on CUDA tensors, just slower) for anything the kernel does not cover.
#include <ATen/ATen.h>

#include <cstdint>
#include <span>
#include <vector>

#include "headwise/arch/model.hpp"

namespace headwise::arch {

// The fused kernel covers: q/k/v on one CUDA device, fp32/bf16/fp16, head_dim a multiple of
// 32 up to 256, at most kCudaMaxEdges finite windows, no learned sink logits.
// False when the kernels are switched off.
inline constexpr int kCudaMaxEdges = 16;
bool cuda_multiwindow_supported(const AttentionInputs& in, size_t finite_edges);

// Process-wide switch, on by default; the environment variable HEADWISE_CUDA_KERNELS=0 starts
// it off. Off, every CUDA input takes the ATen path: an escape hatch, and the baseline the
// benchmark compares the kernel with.
void set_cuda_kernels_enabled(bool enabled);
bool cuda_kernels_enabled();

// Per-level outputs for query rows [t0, t1): [edges.size() + 1, B, heads, t1 - t0, hd] fp32;
// index e < edges.size() is the window edges[e] (plus sinks), the last one the full output.
at::Tensor cuda_multiwindow_levels(const AttentionInputs& in, const std::vector<int64_t>& edges,
                                   int64_t sink_tokens, int64_t t0, int64_t t1);

// windowed_attention on CUDA: per-KV-head windows, [B, T, heads, hd] in q's dtype.
at::Tensor cuda_windowed_attention(const AttentionInputs& in, std::span<const int64_t> kv_windows,
                                   int64_t sink_tokens);

}  // namespace headwise::arch
