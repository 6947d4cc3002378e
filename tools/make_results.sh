#!/usr/bin/env bash
# Regenerates docs/results.md and docs/results.svg: for each budget (a share of the global KV
# bytes of full KV at the context, plus the fixed bytes of the other layers), calibrates the
# default model's policy into policies/ and evaluates it against every baseline at the same bytes
# through the runtime decoder, at the policy's context. Deterministic for a given model (seeds are
# fixed; the eval seed stream is disjoint from the calibration seed).
#   MODEL=models/other CONTEXT=4k SHARES=25,50 SAMPLES=100 tools/make_results.sh
#   WINDOWS=... (default 64,256,1k,full)  TASKS=needle_single,needle_multikey  EVAL_SEED=23
#   CALIB_SAMPLES=8 (the main command's default)  HEADWISE_CALC=path (default build/bin/headwise-calc)
#   JOBS=2 (budgets evaluated at once)
# Each policy's `unconditioned` ablation is the same calibration with --no-conditioning added
# (same data, measure, ladder and budget), handed to eval with --unconditioned-policy.
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
calib_samples=${CALIB_SAMPLES:-8}
bin=${HEADWISE_CALC:-build/bin/headwise-calc}
[ -x "$bin" ] || tools/build.sh
mkdir -p policies docs out

"$bin" mem-estimate --model "$model" --full-kv --context "$context" --json > out/results-full-kv.json
# One budget: its policy, its ablation, then eval (reads the arrays set just before the call).
run_budget() {
  echo "budget $share% ($budget bytes): calibrating $policy and its ablation $ablation"
  "${calibrate[@]}"
  "${ablate[@]}"
  echo "budget $share%: evaluating ($samples samples per task)"
  local start
  start=$(date +%s)
  "${evaluate[@]}" > "out/results-$share.json"
  echo "budget $share%: eval took $(( $(date +%s) - start )) s"
}

# JOBS=n runs up to n budgets at once (one thread each); the figures do not depend on it.
jobs_max=${JOBS:-1}
(( jobs_max > 1 )) && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=()
pids=()
for share in ${shares//,/ }; do
  budget=$(python3 -c "import json,sys; j=json.load(open('out/results-full-kv.json')); c=j['components']
print(j['full_kv_total_bytes'] - c['global_kv_bytes'] + c['global_kv_bytes'] * int(sys.argv[1]) // 100)" "$share")
  policy=policies/$name-eval-$context-$share.yaml
  ablation=policies/$name-eval-$context-$share-unconditioned.yaml
  calibrate=("$bin" --model "$model" --context "$context" --budget "$budget" --windows "$windows"
             --samples "$calib_samples" --seed 0 -o "$policy" --quiet)
  ablate=("${calibrate[@]/#$policy/$ablation}" --no-conditioning)
  evaluate=("$bin" eval --model "$model" --policy "$policy" --unconditioned-policy "$ablation" --samples "$samples"
            --calib-samples 4 --seed "$eval_seed" --json --quiet ${TASKS:+--tasks "$TASKS"})
  # The commands as docs/results.md shows them: with the repository's binary, whatever ran them.
  shown="${calibrate[*]}"$'\n'"${ablate[*]}"
  shown_eval="${evaluate[*]}"
  runs+=("$share" "$policy" "${shown//"$bin"/build/bin/headwise-calc}" "${shown_eval//"$bin"/build/bin/headwise-calc}")
  if (( jobs_max > 1 )); then
    run_budget > "out/make_results-$share.log" 2>&1 &
    pids+=($!)
    if (( ${#pids[@]} >= jobs_max )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  else
    run_budget
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
(( jobs_max > 1 )) && cat out/make_results-*.log

python3 tools/results_report.py "$model" "${runs[@]}"
echo "wrote docs/results.md and docs/results.svg"
