#include "headwise/core/reproducible_math.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string_view>

namespace headwise {

bool strict_cpu_math_requested() {
  const char* flag = std::getenv("HEADWISE_MKL_STRICT");
  return flag == nullptr || std::string_view(flag) != "0";
}

bool pin_cpu_math_threads() {
  // MKL reads MKL_CBWR when it first sets itself up, so this must come before any MKL call
  // (MKL_Set_Dynamic below included). torch's wheel does not export mkl_cbwr_set, only the
  // environment is public. A user's own MKL_CBWR (another branch, or no STRICT) is kept.
  if (strict_cpu_math_requested()) ::setenv("MKL_CBWR", "AUTO,STRICT", /*overwrite=*/0);
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
}  // namespace

}  // namespace headwise
