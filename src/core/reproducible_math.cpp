#include "headwise/core/reproducible_math.hpp"

#include <dlfcn.h>

namespace headwise {

bool pin_cpu_math_threads() {
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
