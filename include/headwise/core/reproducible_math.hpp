#pragma once
#include <ATen/ATen.h>

#include <optional>

namespace headwise {

// Same inputs and seed must give a byte-identical policy, and --resume must reproduce an
// uninterrupted run. A GEMM inside libtorch's CPU kernels (MKL) splits its sums by the number
// of threads it runs on, so its last bits depend on that number: with MKL_DYNAMIC (MKL's
// default) MKL picks it per call from the machine's load (a resumed run on a busy CI machine
// measured a distortion 6e-6 apart from the uninterrupted one), and a forward under load
// changed half its positions by up to 2.9e-4 in 1 run of 30-80. This sets MKL's strict
// reproducibility mode (MKL_CBWR=AUTO,STRICT: ?gemm bits independent of the thread count),
// unless the user set MKL_CBWR or HEADWISE_MKL_STRICT=0, and turns MKL_DYNAMIC off.
// Called once when libheadwise loads (MKL reads MKL_CBWR on its first call, so it must come
// first); safe to call again. Returns false when the torch build has no MKL (nothing to pin).
bool pin_cpu_math_threads();

// False when HEADWISE_MKL_STRICT=0 (tools/bench-strict-math.sh measures what strict mode costs).
bool strict_cpu_math_requested();

// MKL's threaded ?gemm gives a small output (fewer tiles than threads) bits that depend on the
// thread count, strict CNR mode or not: with torch 2.11's MKL, F.linear of [M, K] x [K, N]
// differs between 1 and 2-16 threads for M <= 80, N <= 128 (M*N <= 10240 at 16 threads, up to
// 51200 at 32: the region grows with the thread count), and a single-threaded call gives the
// 1-thread bits at any count (tools/bench-strict-math.sh, docs/hardening.md). Every weight GEMM
// (arch::linear, the expert products) holds one of these: while it lives, MKL runs this thread's
// calls on one thread when rows * cols < intra-op threads * 4096, a margin of 2x over the
// largest differing output measured at 16 and 32 threads. Larger outputs keep every thread.
// HEADWISE_MKL_STRICT=0 turns this off with strict mode.
class SmallGemmOnOneThread {
 public:
  SmallGemmOnOneThread(int64_t rows, int64_t cols, bool on_cpu);
  ~SmallGemmOnOneThread();
  SmallGemmOnOneThread(const SmallGemmOnOneThread&) = delete;
  SmallGemmOnOneThread& operator=(const SmallGemmOnOneThread&) = delete;

 private:
  int previous_ = -1;  // MKL's thread-local setting to restore; -1: nothing changed
};

// The sum of every element of `t` (in `dtype`, default t's), with bits that do not depend on the
// intra-op thread count. ATen reduces a tensor to a single value of at least 32768 elements
// (at::internal::GRAIN_SIZE) with one partial sum per thread, so `t.sum()` gives other last bits
// at another thread count (measured with torch 2.11: a float64 sum of 1.5M elements differs at
// 2-8 threads from 1). A reduction along a dimension with several outputs gives each output to one
// thread, in a fixed order, so this sums blocks of 4096 elements along a dimension until one block
// is left, and reduces that on one thread. Differentiable; any device.
at::Tensor thread_count_independent_sum(const at::Tensor& t,
                                        std::optional<at::ScalarType> dtype = std::nullopt);

}  // namespace headwise
