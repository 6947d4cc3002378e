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
// reproducibility mode (?gemm bits independent of the thread count) and turns MKL_DYNAMIC off.
//
// It also pins the code paths that each library otherwise picks per CPU, so that two x86-64 CPUs
// give the same policy bytes (issue 53; docs/hardening.md "Any x86-64 CPU, same bytes"): MKL's
// branch (MKL_CBWR=AVX2,STRICT, not AUTO: AUTO is AVX512_E1 on an AVX-512 Xeon), ATen's vectorized
// kernels (ATEN_CPU_CAPABILITY=avx2, not avx512: softmax, reductions) and oneDNN's (the depthwise
// convolution; ONEDNN_MAX_CPU_ISA=AVX2). Measured on an AVX-512 Xeon: forcing MKL's AVX2 branch
// against its AUTO one, or ATen's avx2 kernels against its avx512 ones, changed every policy
// `regen --check` recalibrates; with the pin, the policies are the same bytes whatever the
// environment asks for. ATen's and oneDNN's pins are set only on CPUs with AVX2 and FMA (ATen runs
// the kernels it is told to, without checking the CPU): a CPU without them (before Haswell, 2013)
// runs its own paths and may give other bytes. On a non-Intel CPU MKL documents that a named branch
// falls back to AUTO; HEADWISE_MKL_BRANCH=COMPATIBLE (MKL's SSE2 branch, the same on every x86-64
// CPU, slower: docs/performance.md) pins MKL there too, and must then be set on every machine.
// MKL's strict mode covers only its AVX2 and AVX-512 branches, so with COMPATIBLE a GEMM's bits
// depend on the thread count again: the machines must also run at the same one (regen --check: 1).
// The user's MKL_CBWR, ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA are overwritten;
// HEADWISE_MKL_STRICT=0 leaves all of this (and the thread pinning below) to the user.
// Called once when libheadwise loads (each library reads its variable when it first sets itself
// up, so it must come first); safe to call again. Returns false when the torch build has no MKL
// (nothing to pin).
bool pin_cpu_math_threads();

// False when HEADWISE_MKL_STRICT=0 (tools/bench-strict-math.sh measures what strict mode costs).
bool strict_cpu_math_requested();

// The MKL_CBWR value pin_cpu_math_threads sets: "AVX2,STRICT", or "COMPATIBLE,STRICT" with
// HEADWISE_MKL_BRANCH=COMPATIBLE (any other value: AVX2).
const char* pinned_mkl_branch();

// AVX2 with FMA: the CPUs on which pin_cpu_math_threads also pins ATen's and oneDNN's kernels.
bool cpu_has_avx2_fma();

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
