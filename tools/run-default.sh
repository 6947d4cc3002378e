#!/usr/bin/env bash
# The main job on the shipped default model: set-up, build, calibrate. Outputs go to out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh"
cd "$root"
mkdir -p out
build/bin/headwise-calc --model models/tiny-qwen3-next --context 32k --budget 8m \
  --windows 64,256,1k,full --seq-len 2k --samples 4 --seed 0 \
  -o out/policy.yaml --report out/report.json --plot out/windows.svg "$@"
build/bin/headwise-calc mem-estimate --config out/policy.yaml
