#!/usr/bin/env bash
# The test command (README, CI): set-up, build, the whole test suite, then `regen --check` on
# the committed policies (a stale or hand-edited policy fails the build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh"
# The vLLM environment (.venv-vllm, tools/setup.sh --vllm) installs while the build compiles:
# its first install is a download of about 3 GB; afterwards it is a check of a few seconds.
vllm_log=$(mktemp)
"$root/tools/setup_vllm.sh" >"$vllm_log" 2>&1 &
vllm_setup=$!
"$root/tools/build.sh"
if ! wait "$vllm_setup"; then
  cat "$vllm_log" >&2
  echo "test: tools/setup.sh --vllm failed" >&2
  exit 1
fi
cat "$vllm_log"
rm -f "$vllm_log"
# CI installs the vLLM environment, so its test must run, not skip.
export HEADWISE_REQUIRE_VLLM=1
cd "$root/build"
# ctest runs two suites at once; with OpenMP's default of one thread per core each, four threads
# share two cores and spin at OpenMP barriers (measured: the runtime suite 80 s alone, 881 s next
# to the cli suite). One thread per suite keeps the two cores busy without that.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --output-on-failure -j 2 "$@"
cd "$root"
build/bin/headwise-calc regen --manifest policies/manifest.yaml --check --quiet
echo "regen --check: committed policies are up to date"
