// Fused one-pass multi-window attention on CUDA.
//
// Written to be obviously correct (it was built without a GPU to test on; tools/gpu-check.sh
// runs the [gpu] tests that compare it with the CPU path):
//   * one warp per query row (batch, query head, position); 4 warps per block, consecutive
//     warps take consecutive positions of the same head, so they read almost the same keys
//     at almost the same time and K/V come from L1/L2 rather than device memory;
//   * lane i holds elements i, i+32, ... of q and of the output accumulator (head_dim/32 each),
//     so loads of a key row are coalesced; a score is a warp all-reduce (shuffles);
//   * fp32 online softmax (running max, sum, weighted V) over the keys in this order:
//     sink keys, then non-sink keys by increasing distance 0, 1, 2, ... The running state
//     after all keys with distance < w_j IS the prefix merge of the bands below w_j, so the
//     level-j output is written right there, and the full output after the last key. Every
//     key is visited once per row: the whole ladder costs one causal attention.
// Assumptions (checked by cuda_multiwindow_supported): K and V cover the same positions as
// Q (self-attention prefill, position_offset shared), head_dim % 32 == 0 and <= 256, no
// learned sink logits. Workspace: none beyond the output (levels x rows x head_dim).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

// Checks use TORCH_CHECK, not HEADWISE_CHECK: fmt's consteval format strings do not compile
// under nvcc.

#include "headwise/arch/attention_cuda.hpp"
#include "headwise/core/window.hpp"

namespace headwise::arch {
namespace {

constexpr int kWarpsPerBlock = 4;
// Finite "empty" max, as on the CPU path: merging nothing gives 0, never NaN.
constexpr float kEmptyMax = -1e30f;

struct Params {
  int64_t batch, heads, kv_heads, steps, head_dim;  // steps: positions of q, k and v
  int64_t t0, t1;                                   // query rows of this launch
  int64_t position_offset, sink_tokens;
  float scaling, softcap;
  int num_edges;  // finite windows, ascending
  int64_t edges[kCudaMaxEdges];
  const int64_t* kv_window;  // windowed mode: one window per KV head (kFullWindow = none)
};

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

template <typename T, int kPerLane>
struct RowState {
  float q[kPerLane];
  float o[kPerLane];
  float m = kEmptyMax;
  float l = 0.f;
  const T* k;
  const T* v;
  int64_t head_dim;
  int lane;

  // One key: score by warp all-reduce, then the online-softmax update (identical in all lanes
  // for m and l, per lane for o).
  __device__ __forceinline__ void visit(int64_t key, float scaling, float softcap) {
    const T* kr = k + key * head_dim;
    const T* vr = v + key * head_dim;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) dot += q[i] * to_float(kr[lane + 32 * i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    float s = dot * scaling;
    if (softcap > 0.f) s = tanhf(s / softcap) * softcap;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);
    const float p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) o[i] = o[i] * correction + p * to_float(vr[lane + 32 * i]);
    m = m_new;
  }

  __device__ __forceinline__ void emit(float* out) const {
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) out[lane + 32 * i] = o[i] * inv;
  }
};

template <typename T, int kPerLane>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    multiwindow_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       float* __restrict__ out, Params p) {
  const int64_t tc = p.t1 - p.t0;
  const int64_t rows = p.batch * p.heads * tc;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= rows) return;  // uniform per warp: the shuffles below always have 32 lanes
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t ti = row % tc;
  const int64_t bh = row / tc;  // b * heads + h
  const int64_t h = bh % p.heads, b = bh / p.heads;
  const int64_t kvh = h / (p.heads / p.kv_heads);
  const int64_t t = p.t0 + ti;

  RowState<T, kPerLane> st;
  st.k = k + (b * p.kv_heads + kvh) * p.steps * p.head_dim;
  st.v = v + (b * p.kv_heads + kvh) * p.steps * p.head_dim;
  st.head_dim = p.head_dim;
  st.lane = lane;
  const T* qr = q + (bh * p.steps + t) * p.head_dim;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    st.q[i] = to_float(qr[lane + 32 * i]);
    st.o[i] = 0.f;
  }
  const int64_t level_stride = rows * p.head_dim;
  float* out_row = out + row * p.head_dim;

  // Sink keys: absolute positions below sink_tokens, causal.
  int64_t sink_end = p.sink_tokens - p.position_offset;
  sink_end = sink_end < 0 ? 0 : (sink_end > t + 1 ? t + 1 : sink_end);
  for (int64_t key = 0; key < sink_end; ++key) st.visit(key, p.scaling, p.softcap);

  // Non-sink keys at distance [lo, hi) are key = t - d for d in [lo, hi), key >= sink_end.
  auto band = [&](int64_t lo, int64_t hi) {
    const int64_t first = t - lo;                                   // nearest key
    const int64_t far = hi == kFullWindow ? sink_end : t - hi + 1;  // kFullWindow: no bound
    const int64_t last = far > sink_end ? far : sink_end;           // farthest key
    for (int64_t key = first; key >= last; --key) st.visit(key, p.scaling, p.softcap);
  };

  if (p.kv_window != nullptr) {  // windowed mode: one output, this KV head's window
    band(0, p.kv_window[kvh]);
    st.emit(out_row);
    return;
  }
  int64_t lo = 0;
  for (int e = 0; e < p.num_edges; ++e) {
    band(lo, p.edges[e]);
    st.emit(out_row + e * level_stride);
    lo = p.edges[e];
  }
  band(lo, kFullWindow);
  st.emit(out_row + p.num_edges * level_stride);
}

template <typename T>
void launch_typed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                  const Params& p) {
  const int64_t rows = p.batch * p.heads * (p.t1 - p.t0);
  if (rows == 0) return;  // an empty grid is a launch error
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "multi-window kernel: ", rows,
              " rows is too many for one launch");
  const dim3 grid(static_cast<unsigned>(blocks)), block(32 * kWarpsPerBlock);
  auto stream = at::cuda::getCurrentCUDAStream();
  const T* qp = reinterpret_cast<const T*>(q.data_ptr());
  const T* kp = reinterpret_cast<const T*>(k.data_ptr());
  const T* vp = reinterpret_cast<const T*>(v.data_ptr());
  float* op = out.data_ptr<float>();
  switch (p.head_dim / 32) {
    case 1:
      multiwindow_kernel<T, 1><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    case 2:
      multiwindow_kernel<T, 2><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    case 3:
      multiwindow_kernel<T, 3><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    case 4:
      multiwindow_kernel<T, 4><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    case 5:
      multiwindow_kernel<T, 5><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    case 6:
      multiwindow_kernel<T, 6><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    case 7:
      multiwindow_kernel<T, 7><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    case 8:
      multiwindow_kernel<T, 8><<<grid, block, 0, stream>>>(qp, kp, vp, op, p);
      break;
    default:
      TORCH_CHECK(false, "multi-window kernel: head_dim ", p.head_dim, " unsupported");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

Params make_params(const arch::AttentionInputs& in, int64_t sink_tokens, int64_t t0, int64_t t1) {
  Params p{};
  p.batch = in.q.size(0);
  p.heads = in.q.size(1);
  p.steps = in.q.size(2);
  p.head_dim = in.q.size(3);
  p.kv_heads = in.k.size(1);
  p.t0 = t0;
  p.t1 = t1;
  p.position_offset = in.position_offset;
  p.sink_tokens = sink_tokens;
  p.scaling = static_cast<float>(in.scaling);
  p.softcap = static_cast<float>(in.logit_softcap);
  return p;
}

// q, k, v contiguous in one dtype (the kernel indexes them densely); out fp32.
at::Tensor run(const arch::AttentionInputs& in, const Params& p, int64_t levels) {
  const c10::cuda::CUDAGuard guard(in.q.device());
  const at::ScalarType type = in.q.scalar_type();
  const at::Tensor q = in.q.contiguous();
  const at::Tensor k = in.k.to(type).contiguous();
  const at::Tensor v = in.v.to(type).contiguous();
  at::Tensor out =
      at::empty({levels, p.batch, p.heads, p.t1 - p.t0, p.head_dim}, q.options().dtype(at::kFloat));
  switch (type) {
    case at::kFloat:
      launch_typed<float>(q, k, v, out, p);
      break;
    case at::kBFloat16:
      launch_typed<__nv_bfloat16>(q, k, v, out, p);
      break;
    case at::kHalf:
      launch_typed<__half>(q, k, v, out, p);
      break;
    default:
      TORCH_CHECK(false, "multi-window kernel: dtype ", c10::toString(type), " unsupported");
  }
  return out;
}

}  // namespace

namespace {
std::atomic<bool>& kernels_switch() {
  static std::atomic<bool> enabled{[] {
    const char* env = std::getenv("HEADWISE_CUDA_KERNELS");
    return env == nullptr || std::string_view(env) != "0";
  }()};
  return enabled;
}
}  // namespace

void set_cuda_kernels_enabled(bool enabled) {
  kernels_switch() = enabled;
}
bool cuda_kernels_enabled() {
  return kernels_switch();
}

bool cuda_multiwindow_supported(const arch::AttentionInputs& in, size_t finite_edges) {
  if (!cuda_kernels_enabled()) return false;
  const auto type = in.q.scalar_type();
  const int64_t hd = in.q.size(3);
  return in.q.is_cuda() && in.k.device() == in.q.device() && in.v.device() == in.q.device() &&
         (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf) && hd % 32 == 0 &&
         hd <= 256 && !in.sink_logits.defined() &&
         finite_edges <= static_cast<size_t>(kCudaMaxEdges) && in.k.size(2) == in.q.size(2);
}

at::Tensor cuda_multiwindow_levels(const arch::AttentionInputs& in,
                                   const std::vector<int64_t>& edges, int64_t sink_tokens,
                                   int64_t t0, int64_t t1) {
  TORCH_CHECK(cuda_multiwindow_supported(in, edges.size()),
              "multi-window kernel: unsupported inputs");
  Params p = make_params(in, sink_tokens, t0, t1);
  p.num_edges = static_cast<int>(edges.size());
  std::copy(edges.begin(), edges.end(), p.edges);
  p.kv_window = nullptr;
  return run(in, p, p.num_edges + 1);
}

at::Tensor cuda_windowed_attention(const arch::AttentionInputs& in,
                                   std::span<const int64_t> kv_windows, int64_t sink_tokens) {
  TORCH_CHECK(cuda_multiwindow_supported(in, 0), "windowed attention kernel: unsupported inputs");
  TORCH_CHECK(static_cast<int64_t>(kv_windows.size()) == in.k.size(1), "one window per KV head");
  Params p = make_params(in, sink_tokens, 0, in.q.size(2));
  const at::Tensor windows =
      at::tensor(std::vector<int64_t>(kv_windows.begin(), kv_windows.end()), at::kLong)
          .to(in.q.device());
  p.kv_window = windows.data_ptr<int64_t>();
  // [1, B, H, T, hd] fp32 → [B, T, H, hd] in q's dtype. `windows` lives until the copy below
  // is enqueued on the same stream, after the kernel.
  at::Tensor out = run(in, p, 1)[0].transpose(1, 2).to(in.q.scalar_type()).contiguous();
  return out;
}

}  // namespace headwise::arch
