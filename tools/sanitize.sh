#!/usr/bin/env bash
# Builds headwise with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan/ and runs
# the whole test suite there (extra arguments go to ctest). Not part of tools/test.sh: it takes
# far longer (see docs/hardening.md for timings).
#
# libtorch is not instrumented, which shapes the runtime options:
#  - detect_leaks=0: libtorch keeps allocator caches and static registries alive at exit;
#    LeakSanitizer would report those, not headwise leaks.
#  - protect_shadow_gap=0: the CUDA runtime libtorch links maps memory at fixed addresses in
#    ASan's shadow gap; with the gap protected it fails to initialise (aborts at start-up).
#  - alloc_dealloc_mismatch=0: libtorch objects created with new[] in one library and freed in
#    another (both uninstrumented) trip the mismatch check spuriously.
#  - UBSan halts on the first error so a finding fails the test run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/tools/setup.sh"
jobs=${HEADWISE_JOBS:-$(nproc)}
# -O1 -g1: a sanitizer build of the whole library is long; -O1 keeps the suite's run time
# reasonable and -g1 still gives file:line in reports. CUDA kernels are left out (nvcc does
# not take -fsanitize; no test needs a GPU), so torch's cmake is told the arch list rather
# than probing for a GPU.
cmake -S . -B build-asan -G Ninja -DHEADWISE_SANITIZE=ON -DHEADWISE_CUDA=${HEADWISE_SANITIZE_CUDA:-OFF} \
  -DTORCH_CUDA_ARCH_LIST="8.0;9.0" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" >/dev/null
ninja -C build-asan -j "$jobs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:protect_shadow_gap=0:alloc_dealloc_mismatch=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd build-asan
start=$(date +%s)
ctest --output-on-failure -j 2 "$@"
echo "sanitize: test suite passed under ASan+UBSan in $(( $(date +%s) - start ))s"
