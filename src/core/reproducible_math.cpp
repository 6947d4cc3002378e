#include "headwise/core/reproducible_math.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string_view>

namespace headwise {

bool strict_cpu_math_requested() {
  const char* flag = std::getenv("HEADWISE_MKL_STRICT");
  return flag == nullptr || std::string_view(flag) != "0";
}

// Every x86-64 CPU of interest (Intel since Haswell, 2013; AMD since 2015), and what ATen's avx2
// kernels need (ATen takes ATEN_CPU_CAPABILITY without checking the CPU).
bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const char* pinned_mkl_branch() {
  const char* branch = std::getenv("HEADWISE_MKL_BRANCH");
  if (branch != nullptr && std::string_view(branch) == "COMPATIBLE") return "COMPATIBLE,STRICT";
  return "AVX2,STRICT";
}

bool pin_cpu_math_threads() {
  // Each library reads its variable once, when it first sets itself up, so this must come before
  // any MKL call (MKL_Set_Dynamic below included), any ATen CPU kernel and any oneDNN primitive.
  // torch's wheel does not export mkl_cbwr_set, only the environment is public. Overwritten: a
  // policy must not depend on the CPU or on what a shell exported (HEADWISE_MKL_STRICT=0 leaves
  // all three to the user).
  if (strict_cpu_math_requested()) {
    ::setenv("MKL_CBWR", pinned_mkl_branch(), /*overwrite=*/1);
    if (cpu_has_avx2_fma()) {
      ::setenv("ATEN_CPU_CAPABILITY", "avx2", /*overwrite=*/1);
      ::setenv("ONEDNN_MAX_CPU_ISA", "AVX2", /*overwrite=*/1);
    }
  }
  // Looked up at run time: torch builds without MKL (aarch64, some source builds) lack the symbol.
  // MKL_Set_Dynamic is the by-value C entry point (mkl.h maps mkl_set_dynamic onto it); the
  // lower-case export is the Fortran one and takes a pointer.
  using SetDynamic = void (*)(int);
  const auto set_dynamic = reinterpret_cast<SetDynamic>(::dlsym(RTLD_DEFAULT, "MKL_Set_Dynamic"));
  if (set_dynamic == nullptr) return false;
  set_dynamic(0);
  return true;
}

namespace {
[[maybe_unused]] const bool kPinnedAtLoad = pin_cpu_math_threads();

// Below ATen's GRAIN_SIZE (32768), so the last reduction runs on one thread.
constexpr int64_t kBlock = 4096;
}  // namespace

namespace {

// MKL_Set_Num_Threads_Local (by value; 0 restores the global setting), looked up at run time like
// MKL_Set_Dynamic: null on torch builds without MKL.
using SetLocalThreads = int (*)(int);
SetLocalThreads mkl_set_local_threads() {
  static const auto fn =
      reinterpret_cast<SetLocalThreads>(::dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
  return fn;
}

constexpr int64_t kOutputPerThread = 4096;

}  // namespace

SmallGemmOnOneThread::SmallGemmOnOneThread(int64_t rows, int64_t cols, bool on_cpu) {
  // Read once: HEADWISE_MKL_STRICT=0 (MKL's defaults, for tools/bench-strict-math.sh) turns this
  // off too.
  static const bool strict = strict_cpu_math_requested();
  const int threads = at::get_num_threads();
  if (!strict || !on_cpu || threads <= 1 || rows * cols >= threads * kOutputPerThread) return;
  if (const SetLocalThreads set = mkl_set_local_threads()) previous_ = set(1);
}

SmallGemmOnOneThread::~SmallGemmOnOneThread() {
  if (previous_ >= 0) mkl_set_local_threads()(previous_);
}

at::Tensor thread_count_independent_sum(const at::Tensor& t, std::optional<at::ScalarType> dtype) {
  at::Tensor x = t.to(dtype.value_or(t.scalar_type())).reshape({-1});
  while (x.numel() > kBlock) {
    const int64_t pad = (kBlock - x.numel() % kBlock) % kBlock;
    x = at::constant_pad_nd(x, {0, pad})
            .view({-1, kBlock})
            .sum(-1);  // one output per block: thread-count free
  }
  return x.sum();
}

}  // namespace headwise
