#!/usr/bin/env bash
# The main job on the shipped default model: set-up, build (the CLI only: what it runs), calibrate.
# Outputs go to out/. The configuration docs/results.md evaluates at 50% of full KV (the 8K-trained
# default model at 4K tokens, ladder 128,512,2k,full; the default measure, answer-tv, and keep
# rules, auto): with no extra flags the policy is byte-identical to
# policies/tiny-qwen3-next-8k-eval-4k-50.yaml. That table was made before --state-dtype, with the
# states in their native dtypes, so this job asks for those (--state-dtype native) instead of the
# float32 default (docs/memory.md): the budget then buys the windows the table evaluated.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/build.sh" headwise-calc
cd "$root"
mkdir -p out
build/bin/headwise-calc --model models/tiny-qwen3-next-8k --context 4k --budget 2084k \
  --windows 128,512,2k,full --samples 8 --seed 0 --state-dtype native \
  -o out/policy.yaml --report out/report.json --plot out/windows.svg "$@"
build/bin/headwise-calc mem-estimate --config out/policy.yaml
committed=policies/tiny-qwen3-next-8k-eval-4k-50.yaml
if cmp -s out/policy.yaml "$committed"; then
  echo "out/policy.yaml is byte-identical to $committed (evaluated in docs/results.md)"
elif cmp -s <(grep -v expected_distortion: out/policy.yaml) <(grep -v expected_distortion: "$committed"); then
  # Seen on an AMD EPYC host: the curves' last digits follow the CPU's floating point (MKL's code
  # path), not the thread count; the choices do not move. regen --check allows 1e-4 of a layer's scale.
  echo "out/policy.yaml makes the choices of $committed (evaluated in docs/results.md): the same windows," \
       "rules and bytes; only expected_distortion differs, in its last digits (this CPU's floating point)"
else
  echo "out/policy.yaml differs from $committed (evaluated in docs/results.md): diff them to see how"
fi
