#!/usr/bin/env bash
# The test command (README, CI): set-up, build, the whole test suite, then `regen --check` on
# the committed policies (a stale or hand-edited policy fails the build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
cd "$root/build"
ctest --output-on-failure -j 2 "$@"
cd "$root"
build/bin/headwise-calc regen --manifest policies/manifest.yaml --check --quiet
echo "regen --check: committed policies are up to date"
