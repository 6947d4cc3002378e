#pragma once

namespace headwise {

// Same inputs and seed must give a byte-identical policy, and --resume must reproduce an
// uninterrupted run. MKL (inside libtorch's CPU GEMMs) by default picks its thread count per
// call from the machine's load (MKL_DYNAMIC), which changes how a GEMM splits its sums and so
// the last bits of the result: a resumed run on a busy CI machine then measured a distortion
// 6e-6 apart from the uninterrupted one. This pins MKL to its configured thread count.
// Called once when libheadwise loads; safe to call again. Returns false when the torch build
// has no MKL (nothing to pin).
bool pin_cpu_math_threads();

}  // namespace headwise
