#!/usr/bin/env bash
# Configures and builds headwise into build/ (build/bin/headwise-calc, build/bin/headwise-tests).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/tools/setup.sh"
jobs=${HEADWISE_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j "$jobs"
