#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs each for SECONDS (default
# 60) on its seed corpus in tests/fuzz/<target>/. New interesting inputs go to
# build-fuzz/corpus/<target>/ (not committed); crashes to build-fuzz/findings/<target>/.
#   tools/fuzz.sh [seconds] [target...]     targets: safetensors_header config_spec policy_yaml
# Exit status is non-zero when any target found a crash.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(safetensors_header config_spec policy_yaml)
cd "$root"
"$root/tools/setup.sh"
jobs=${HEADWISE_JOBS:-$(nproc)}
cmake -S . -B build-fuzz -G Ninja -DHEADWISE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ >/dev/null
ninja -C build-fuzz -j "$jobs" "${targets[@]/#/fuzz_}"
# libtorch is not instrumented and keeps allocations alive until exit: leak reports would be
# about it, not us. The parsers run in-process, so a leak of ours would show as RSS growth,
# which -rss_limit_mb catches.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for target in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$target findings=build-fuzz/findings/$target
  mkdir -p "$corpus" "$findings"
  echo "== fuzz_$target for ${seconds}s"
  if ! build-fuzz/bin/fuzz_$target "$corpus" "tests/fuzz/$target" -max_total_time="$seconds" -max_len=8192 \
       -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 -artifact_prefix="$findings/"; then
    echo "fuzz_$target: finding saved under $findings/" >&2
    status=1
  fi
done
exit $status
