#pragma once

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

}  // namespace headwise
