#!/usr/bin/env bash
# Regenerates docs/results.md and docs/results.svg: for each budget (a share of the global KV
# bytes of full KV at the context, plus the fixed bytes of the other layers), calibrates the
# model's policy into policies/ and evaluates it against every baseline at the same bytes
# through the runtime decoder, at the policy's context. Deterministic for a given model (seeds are
# fixed; the eval seed stream is disjoint from the calibration seed).
# Defaults: models/tiny-qwen3-next-8k (trained to 8K) at 4K tokens, ladder 128,512,2k,full: every
# finite level is shorter than the samples (measured with JOBS=2 on 2 cores, every method incl. the
# chunked SnapKV/AdaKV, three tasks with needle_chain, keep rules: 85 min, eval 5092 s of it).
#   MODEL=models/other CONTEXT=2k SHARES=25,50 SAMPLES=100 tools/make_results.sh
#   WINDOWS=... (default 128,512,2k,full)  TASKS=... (default: eval's, needle_single,needle_multikey,needle_chain for a token model)  EVAL_SEED=23
#   RESULTS=docs/results-2k (writes RESULTS.md and RESULTS.svg; default docs/results)
#   CALIB_SAMPLES=8 (the main command's default)  HEADWISE_CALC=path (default build/bin/headwise-calc)
#   KEEP_RULES=window (passed as --keep-rules; default: the main command's, auto = window,h2o)
#   FOLLOW_UPS=1 (passed as --follow-ups to every calibration; only with snap in KEEP_RULES)
#   TAG=snap (policies/NAME-eval-CONTEXT-SHARE-TAG.yaml, so that another rule set's policies sit
#   beside the default ones instead of replacing them; docs/results-snap.md is made with
#   RESULTS=docs/results-snap TAG=snap KEEP_RULES=window,h2o,snap FOLLOW_UPS=1)
#   STATE_DTYPE=native (passed as --state-dtype to mem-estimate and every calibration: native, the
#   default, keeps the recurrent/conv states as the architecture does, as every policy of
#   policies/manifest.yaml pins it, so the shares' bytes and the table stay comparable across
#   regenerations; float32 is the main command's default)
#   BASELINES=full,unconditioned (eval --baselines; default: eval's, every method and ablation)
#   DUO_STEPS=500 (eval --duo-steps. DuoAttention's paper trains 2000 steps; one step at 4K costs ~2 s of one
#   core here (measured), so 2000 would add ~67 min to the eval on this machine: 500 by default, the
#   count is in the report's JSON; DUO_STEPS=2000 for the paper's)
#   JOBS=2 (the default: budgets calibrated at once, then method runs at once in the one eval,
#   `eval --jobs`, one intra-op thread each; the eval runs every budget, sharing the full-KV
#   reference and the budget-free baseline work; JOBS=1 runs one thing at a time)
# Each policy's `unconditioned` ablation is the same calibration with --no-conditioning added
# (same data, measure, ladder and budget), handed to eval with --unconditioned-policy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
model=${MODEL:-models/tiny-qwen3-next-8k}
name=$(basename "$model")
samples=${SAMPLES:-100}
context=${CONTEXT:-4k}
shares=${SHARES:-25,50}
windows=${WINDOWS:-128,512,2k,full}
results=${RESULTS:-docs/results}
eval_seed=${EVAL_SEED:-23}
calib_samples=${CALIB_SAMPLES:-8}
keep_rules=${KEEP_RULES:-}
follow_ups=${FOLLOW_UPS:-}
tag=${TAG:+-$TAG}
state_dtype=${STATE_DTYPE:-native}
bin=${HEADWISE_CALC:-build/bin/headwise-calc}
[ -x "$bin" ] || tools/build.sh
mkdir -p policies docs out

"$bin" mem-estimate --model "$model" --full-kv --context "$context" --state-dtype "$state_dtype" \
  --json > out/results-full-kv.json
# One budget's policy and its ablation (reads the arrays set just before the call).
calibrate_budget() {
  echo "budget $share% ($budget bytes): calibrating $policy and its ablation $ablation"
  "${calibrate[@]}"
  "${ablate[@]}"
}

# JOBS=n calibrates up to n budgets at once (one thread each); the figures do not depend on it.
jobs_max=${JOBS:-2}
runs=()
pids=()
policies=()
ablations=()
share_list=()
for share in ${shares//,/ }; do
  budget=$(python3 -c "import json,sys; j=json.load(open('out/results-full-kv.json')); c=j['components']
print(j['full_kv_total_bytes'] - c['global_kv_bytes'] + c['global_kv_bytes'] * int(sys.argv[1]) // 100)" "$share")
  policy=policies/$name-eval-$context-$share$tag.yaml
  ablation=policies/$name-eval-$context-$share$tag-unconditioned.yaml
  calibrate=("$bin" --model "$model" --context "$context" --budget "$budget" --windows "$windows"
             --samples "$calib_samples" --seed 0 --state-dtype "$state_dtype"
             ${keep_rules:+--keep-rules "$keep_rules"} ${follow_ups:+--follow-ups "$follow_ups"} -o "$policy" --quiet)
  ablate=("${calibrate[@]/#$policy/$ablation}" --no-conditioning)
  policies+=(--policy "$policy")
  ablations+=(--unconditioned-policy "$ablation")
  share_list+=("$share")
  shown="${calibrate[*]}"$'\n'"${ablate[*]}"
  runs+=("$share" "$policy" "${shown//"$bin"/build/bin/headwise-calc}")
  if (( jobs_max > 1 )); then
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} calibrate_budget > "out/make_results-$share.log" 2>&1 &
    pids+=($!)
    if (( ${#pids[@]} >= jobs_max )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  else
    calibrate_budget
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
(( jobs_max > 1 )) && cat out/make_results-*.log

# Every budget in one eval: the samples, full KV, the retrieval scores and duo's gates do not
# depend on the budget, so they are computed once for the whole curve.
evaluate=("$bin" eval --model "$model" "${policies[@]}" "${ablations[@]}" --samples "$samples"
          --calib-samples 4 --seed "$eval_seed" --json --quiet --jobs "$jobs_max" ${TASKS:+--tasks "$TASKS"}
          ${BASELINES:+--baselines "$BASELINES"} --duo-steps "${DUO_STEPS:-500}")
echo "evaluating ${#share_list[@]} budgets ($samples samples per task)"
start=$(date +%s)
"${evaluate[@]}" > out/results-all.json
echo "eval took $(( $(date +%s) - start )) s"
python3 - out/results-all.json "${share_list[@]}" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
evaluations = doc["evaluations"] if "evaluations" in doc else [doc]
for share, evaluation in zip(sys.argv[2:], evaluations):
    json.dump(evaluation, open(f"out/results-{share}.json", "w"), indent=2)
PY
# The commands as docs/results.md shows them: with the repository's binary, whatever ran them.
shown_eval="${evaluate[*]}"
report_args=()
for (( i = 0; i < ${#runs[@]}; i += 3 )); do
  report_args+=("${runs[i]}" "${runs[i + 1]}" "${runs[i + 2]}" "${shown_eval//"$bin"/build/bin/headwise-calc}")
done

python3 tools/results_report.py --out "$results" "$model" "${report_args[@]}"
echo "wrote $results.md and $results.svg"
