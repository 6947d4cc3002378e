#!/usr/bin/env bash
# Regenerates docs/results.md and docs/results.svg: for each budget (a share of the global KV
# bytes of full KV at the context, plus the fixed bytes of the other layers), calibrates the
# default model's policy into policies/ and evaluates it against every baseline at the same bytes
# through the runtime decoder, at the policy's context. Deterministic for a given model (seeds are
# fixed; the eval seed stream is disjoint from the calibration seed).
#   MODEL=models/other CONTEXT=4k SHARES=25,50 SAMPLES=100 tools/make_results.sh
#   WINDOWS=... (default 64,256,1k,full)  TASKS=needle_single,needle_multikey  EVAL_SEED=23
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
model=${MODEL:-models/tiny-qwen3-next}
name=$(basename "$model")
samples=${SAMPLES:-100}
context=${CONTEXT:-2k}
shares=${SHARES:-25,50}
windows=${WINDOWS:-64,256,1k,full}
eval_seed=${EVAL_SEED:-23}
bin=build/bin/headwise-calc
[ -x "$bin" ] || tools/build.sh
mkdir -p policies docs out

"$bin" mem-estimate --model "$model" --full-kv --context "$context" --json > out/results-full-kv.json
runs=()
for share in ${shares//,/ }; do
  budget=$(python3 -c "import json,sys; j=json.load(open('out/results-full-kv.json')); c=j['components']
print(j['full_kv_total_bytes'] - c['global_kv_bytes'] + c['global_kv_bytes'] * int(sys.argv[1]) // 100)" "$share")
  policy=policies/$name-eval-$context-$share.yaml
  calibrate=("$bin" --model "$model" --context "$context" --budget "$budget" --windows "$windows" --samples 4 --seed 0
             -o "$policy" --quiet)
  evaluate=("$bin" eval --model "$model" --policy "$policy" --samples "$samples" --calib-samples 4 --seed "$eval_seed"
            --json --quiet ${TASKS:+--tasks "$TASKS"})
  echo "budget $share% ($budget bytes): calibrating $policy"
  "${calibrate[@]}"
  echo "budget $share%: evaluating ($samples samples per task)"
  start=$(date +%s)
  "${evaluate[@]}" > "out/results-$share.json"
  echo "budget $share%: eval took $(( $(date +%s) - start )) s"
  runs+=("$share" "$policy" "${calibrate[*]}" "${evaluate[*]}")
done

python3 tools/results_report.py "$model" "${runs[@]}"
echo "wrote docs/results.md and docs/results.svg"
