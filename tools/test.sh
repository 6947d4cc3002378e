#!/usr/bin/env bash
# The test command (README, CI): set-up, build, the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
cd "$root/build"
ctest --output-on-failure -j 2 "$@"
