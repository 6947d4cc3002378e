#!/usr/bin/env bash
# Regenerates docs/results-peers.md: headwise against the field's own implementations (kvpress's
# presses, PyPI kvpress in .venv-kvpress/) on the Gemma-3-layout evidence model, at the same
# retained K/V bytes, on the same samples (issue 41).
#
# For each budget (a share of full KV's global-KV bytes, plus the fixed bytes of the other layers,
# as tools/make_results.sh): calibrates the policy and its --no-conditioning ablation with the main
# command's defaults; writes headwise's eval samples (`eval --write-samples`); answers them with
# headwise and its ablation through HeadwiseCache in transformers, with full KV, and with each
# press in kvpress's environment keeping as many K/V tokens per KV head and global layer as the
# policy's bytes (its bookkeeping included) pay for; then tools/peers_report.py writes the report.
#   MODEL=models/tiny-gemma3-8k CONTEXT=4k SHARES=25,50 SAMPLES=50 EVAL_SEED=23 WINDOWS=128,512,2k,full
#   PRESSES=snapkv,adakv-expected,pyramidkv,streamingllm,tova,knorm  PRESSES_PER_JOB=2  JOBS=2
#   OUT=docs/results-peers.md
#   KEEP_RULES=window,h2o,snap (--keep-rules; default: the main command's)  FOLLOW_UPS=1 (--follow-ups)
#   TAG=snap (policies/NAME-peers-CONTEXT-SHARE-TAG.yaml, beside the default rule set's policies)
#   ABLATION=snapkv-headwise-slots (default; empty: none): eval's baseline of that name, SnapKV's rule
#   on the policy's own slots per head, run by headwise's runtime on the same samples (`eval
#   --write-tokens`, each answer checked against its sample's prompt) and reported as one more row
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
model=${MODEL:-models/tiny-gemma3-8k}
name=$(basename "$model")
context=${CONTEXT:-4k}
shares=${SHARES:-25,50}
samples=${SAMPLES:-50}
eval_seed=${EVAL_SEED:-23}
windows=${WINDOWS:-128,512,2k,full}
default_presses=snapkv,adakv-expected,pyramidkv,streamingllm,tova,knorm
presses=${PRESSES:-$default_presses}
jobs_max=${JOBS:-2}
report=${OUT:-docs/results-peers.md}
keep_rules=${KEEP_RULES:-}
follow_ups=${FOLLOW_UPS:-}
tag=${TAG:+-$TAG}
ablation=${ABLATION-snapkv-headwise-slots}
bin=${HEADWISE_CALC:-build/bin/headwise-calc}
[ -x "$bin" ] || tools/build.sh headwise-calc
policy_of() { echo "policies/$name-peers-$context-$1$tag.yaml"; }  # one budget's policy (a share)
tools/setup.sh --kvpress >/dev/null
[ -f "$model/config.json" ] || { echo "make_results_peers: $model/config.json: no such model (tools/train_gemma3_model.py makes it)" >&2; exit 2; }
work=out/peers
rm -rf "$work"  # answers of an earlier run must not mix with this one's
mkdir -p "$work" policies docs
export OMP_NUM_THREADS=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error

# Runs "$@" in the background, at most $jobs_max at once; a failed job fails the script.
running=0
spawn() {
  if (( running >= jobs_max )); then wait -n; running=$((running - 1)); fi
  "$@" &
  running=$((running + 1))
}
wait_all() { while (( running > 0 )); do wait -n; running=$((running - 1)); done; }

"$bin" mem-estimate --model "$model" --full-kv --context "$context" --state-dtype native --json > "$work/full-kv.json"
commands=()
for share in ${shares//,/ }; do
  budget=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); c=j['components']
print(j['full_kv_total_bytes'] - c['global_kv_bytes'] + c['global_kv_bytes'] * int(sys.argv[2]) // 100)" "$work/full-kv.json" "$share")
  policy=$(policy_of "$share")
  calibrate=("$bin" --model "$model" --context "$context" --budget "$budget" --windows "$windows"
             --seed 0 --state-dtype native ${keep_rules:+--keep-rules "$keep_rules"}
             ${follow_ups:+--follow-ups "$follow_ups"} -o "$policy" --quiet)
  ablate=("${calibrate[@]/#$policy/${policy%.yaml}-unconditioned.yaml}" --no-conditioning)
  commands+=("${calibrate[*]}" "${ablate[*]}")
  spawn "${calibrate[@]}"
  spawn "${ablate[@]}"
done
wait_all

first=$(policy_of "${shares%%,*}")
write=("$bin" eval --model "$model" --policy "$first" --samples "$samples" --seed "$eval_seed"
       --write-samples "$work/samples.jsonl" --quiet)
"${write[@]}"
commands+=("${write[*]}")

# The ablation in headwise's runtime, every budget's policy in one eval (one full-KV reference),
# on the samples just written (same seed and count; the export checks every prompt's SHA-256).
if [[ -n $ablation ]]; then
  runtime_policies=()
  for share in ${shares//,/ }; do runtime_policies+=(--policy "$(policy_of "$share")"); done
  run_ablation=("$bin" eval --model "$model" "${runtime_policies[@]}" --baselines "$ablation" --samples "$samples"
                --seed "$eval_seed" --calib-samples 4 --json --quiet --write-tokens "$work/tokens-ablation.jsonl")
  commands+=("${run_ablation[*]} > $work/eval-ablation.json")
  spawn bash -c '"$@" > "'"$work"'/eval-ablation.json"' _ "${run_ablation[@]}"
fi

for share in ${shares//,/ }; do
  policy=$(policy_of "$share")
  "$bin" mem-estimate --config "$policy" --context "$context" --json > "$work/policy-$share.json"
  # The presses' budget: the K/V tokens per KV head and global layer the policy's bytes (its
  # bookkeeping included) pay for, in bf16, with the geometry the report counts bytes by.
  keep=$(python3 - "$work/policy-$share.json" "$model/config.json" "$work/keep-$share.json" <<'PY'
import json, sys
est, config = (json.load(open(p)) for p in sys.argv[1:3])
config = config.get("text_config", config)
c = est["components"]
global_layers = sum(t == "full_attention" for t in config["layer_types"])
b = {"token_bytes": 2 * config["head_dim"] * 2, "global_layers": global_layers,
     "global_kv_heads": config["num_key_value_heads"] * global_layers}
b["keep_tokens"] = (c["global_kv_bytes"] + c.get("selection_state_bytes", 0)) // (b["token_bytes"] * b["global_kv_heads"])
json.dump(b, open(sys.argv[3], "w"))
print(b["keep_tokens"])
PY
)
  main_methods=headwise,unconditioned
  [[ $policy == "$first" ]] && main_methods=full,$main_methods
  run_main=(python3 tools/peers_eval.py --model "$model" --samples "$work/samples.jsonl" --policy "$policy"
            --unconditioned-policy "${policy%.yaml}-unconditioned.yaml" --methods "$main_methods"
            --out "$work/answers-$share-headwise.jsonl")
  commands+=("PYTHONPATH=python ${run_main[*]}")
  spawn env PYTHONPATH=python "${run_main[@]}"
  # The presses in groups of PRESSES_PER_JOB, one process each, so that the jobs stay balanced.
  kv_methods=(${presses//,/ })
  kv_methods=("${kv_methods[@]/#/kvpress:}")
  [[ $policy == "$first" ]] && kv_methods=(full@kvpress "${kv_methods[@]}")
  per_job=${PRESSES_PER_JOB:-2}
  for (( i = 0; i < ${#kv_methods[@]}; i += per_job )); do
    group=$(IFS=,; echo "${kv_methods[*]:i:per_job}")
    run_press=(.venv-kvpress/bin/python tools/peers_eval.py --model "$model" --samples "$work/samples.jsonl"
               --keep-tokens "$keep" --methods "$group" --out "$work/answers-$share-kvpress-$((i / per_job)).jsonl")
    commands+=("${run_press[*]}")
    spawn "${run_press[@]}"
  done
done
wait_all
if [[ -n $ablation ]]; then
  for share in ${shares//,/ }; do
    python3 tools/paired_answers.py --samples "$work/samples.jsonl" --tokens "$work/tokens-ablation.jsonl" \
      --export "$ablation" --policy "$(policy_of "$share")" \
      --eval-json "$work/eval-ablation.json" --out "$work/answers-$share-ablation.jsonl"
  done
fi

# The commands as the report shows them: with the repository's binary, whatever ran them.
commands=("${commands[@]//"$bin"/build/bin/headwise-calc}")
policies=()
for share in ${shares//,/ }; do policies+=("$(policy_of "$share")"); done
python3 - "$work" "$model" "$context" "$shares" "$samples" "$eval_seed" "$default_presses" "${#policies[@]}" \
  "${policies[@]}" "${commands[@]}" <<'PY'
import glob, json, subprocess, sys
work, model, context, shares, samples, seed, default_presses, count, *rest = sys.argv[1:]
policies, commands = rest[:int(count)], rest[int(count):]
full = json.load(open(f"{work}/full-kv.json"))
kvpress_version, kv_tf = subprocess.run(
    [".venv-kvpress/bin/python", "-c", "import importlib.metadata as m; print(m.version('kvpress'), m.version('transformers'))"],
    capture_output=True, text=True, check=True).stdout.split()
budgets = {}
first = shares.split(",")[0]
for share, policy in zip(shares.split(","), policies):
    est = json.load(open(f"{work}/policy-{share}.json"))["components"]
    b = {"policy": policy,
         "policy_kv_bytes": est["global_kv_bytes"], "policy_selection_bytes": est.get("selection_state_bytes", 0),
         "full_kv_bytes": full["components"]["global_kv_bytes"], "context": context,
         **json.load(open(f"{work}/keep-{share}.json")),
         "answers": sorted(glob.glob(f"{work}/answers-{share}-*.jsonl"))}
    b["policy_bytes"] = b["policy_kv_bytes"] + b["policy_selection_bytes"]
    # Full KV does not depend on the budget: answered once, with the first budget's methods.
    b["full_answers"] = sorted(glob.glob(f"{work}/answers-{first}-*.jsonl"))
    budgets[share] = b
json.dump({"samples": f"{work}/samples.jsonl", "model": model, "model_name": model.rstrip("/").split("/")[-1], "budgets": budgets,
           "commands": commands, "samples_per_task": int(samples), "seed": int(seed), "context": context,
           "kvpress_version": kvpress_version, "kvpress_transformers": kv_tf,
           "default_presses": default_presses}, open(f"{work}/meta.json", "w"), indent=1)
PY
python3 tools/peers_report.py --meta "$work/meta.json" --out "$report"
echo "wrote $report"
