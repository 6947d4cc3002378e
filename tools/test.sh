#!/usr/bin/env bash
# The test command (README, CI = .ci/run): set-up, build, the whole test suite, which includes
# `regen --check` on the committed policies (ctest entry `policies`: a stale or hand-edited policy
# fails the build). Extra arguments go to ctest (e.g. `-R runtime`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The base set-up first (torch, transformers): the build needs it, and the two peer set-ups below
# would otherwise both install it on a fresh machine.
"$root/tools/setup.sh"
# The peers' environments install while the build compiles: kvpress (.venv-kvpress, for the `peers`
# entry: a few MB over this machine's torch) and vLLM (.venv-vllm, tools/setup.sh --vllm: a thin
# venv over a per-machine base whose first install is a download of about 3 GB; afterwards a
# check of a second, or about 15 s in a fresh clone).
logs=$(mktemp -d)
"$root/tools/setup.sh" --kvpress >"$logs/kvpress" 2>&1 &
kvpress_setup=$!
"$root/tools/setup_vllm.sh" >"$logs/vllm" 2>&1 &
vllm_setup=$!
"$root/tools/build.sh"
for peer in kvpress vllm; do
  setup=${peer}_setup
  if ! wait "${!setup}"; then
    cat "$logs/$peer" >&2
    echo "test: tools/setup.sh --$peer failed" >&2
    exit 1
  fi
  cat "$logs/$peer"
done
rm -rf "$logs"
# CI installs the vLLM environment, so its test must run, not skip.
export HEADWISE_REQUIRE_VLLM=1 HEADWISE_REQUIRE_KVPRESS=1
cd "$root/build"
# One suite per core, one intra-op thread each: with OpenMP's default of one thread per core per
# suite, four threads share two cores and spin at OpenMP barriers (measured: the runtime suite 80 s
# alone, 881 s next to the cli suite). Results do not depend on the count (docs/hardening.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# This command installs torch and transformers (tools/setup.sh): their absence is a failure here,
# never a skip (docs/hardening.md, "Test exit codes").
unset HEADWISE_PYTHON_STACK_OPTIONAL
# Cores, not OMP_NUM_THREADS: GNU nproc returns OMP_NUM_THREADS when it is set (1 here), which ran
# the entries one at a time.
ctest --output-on-failure -j "${HEADWISE_TEST_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}" "$@"
