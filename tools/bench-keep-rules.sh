#!/usr/bin/env bash
# What serving a keep-rules policy costs against a policy of windows only, at the same budget:
# a layer with an h2o head is served from the runtime's eviction cache (scores accumulated per
# query, eviction after every prefill chunk and every decoded token) instead of the grouped
# cache's ring buffers. Both policies run in one `eval` (the same samples, one job at a time, the
# same thread count), and the table gives prefill and decode tokens per second of each and their
# ratio, with full KV beside them.
#
#   tools/bench-keep-rules.sh [--threads 2] [--reps 1] [--out DIR]
#
# Measured (2026-12-03, 2 threads, --reps 3, alone): keep rules / windows 0.90 prefill, 0.86 decode
# (medians; per rep 0.90-0.99 and 0.85-0.99), the same needle_single accuracy (1.00).
#
# Policies: the committed policies/tiny-qwen3-next-8k-eval-4k-50.yaml (keep rules: h2o in three
# of layer 1's heads) and the same calibration with --keep-rules window (made once into --out, not
# timed). Samples: 20 needle_single samples at the policies' 4K context, eval seed 7.
# HEADWISE_CALC overrides the binary (default build/bin/headwise-calc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
threads=2 reps=1 out=/tmp/headwise-bench-keep-rules
bench_parse_args bench-keep-rules "$@"
mkdir -p "$out"
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
model=$root/models/tiny-qwen3-next-8k
rules=$root/policies/tiny-qwen3-next-8k-eval-4k-50.yaml
windows=$out/windows-only-4k-50.yaml
if [[ ! -f $windows ]]; then
  # The committed policy's calibration (policies/manifest.yaml: 2,134,016 B = 2084k) with window rules.
  "$calc" --model "$model" --context 4k --budget 2084k --windows 128,512,2k,full --samples 8 --seed 0 \
    --keep-rules window -o "$windows" --quiet
fi
for (( rep = 0; rep < reps; ++rep )); do
  "$calc" eval --model "$model" --policy "$rules" --policy "$windows" --baselines full --tasks needle_single \
    --samples 20 --seed 7 --jobs 1 --json --quiet > "$out/eval-$rep.json"
done
python3 - "$out" "$reps" <<'EOF'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{out}/eval-{r}.json"))["evaluations"] for r in range(reps)]
def rate(policy_index, method, key):
    return statistics.median(next(m for m in run[policy_index]["methods"] if m["name"] == method)[key] for run in runs)
rows = [("keep rules (h2o in layer 1)", 0, "headwise"), ("windows only", 1, "headwise"), ("full KV", 0, "full")]
print("| policy | bytes | needle_single | prefill tok/s | decode tok/s |")
print("|---|---:|---:|---:|---:|")
for label, index, method in rows:
    m = next(m for m in runs[0][index]["methods"] if m["name"] == method)
    print(f"| {label} | {m['cache_bytes_measured']:,} | {m['tasks']['needle_single']:.2f} | "
          f"{rate(index, method, 'prefill_tokens_per_s'):.0f} | {rate(index, method, 'decode_tokens_per_s'):.0f} |")
ratio = {k: rate(0, "headwise", k) / rate(1, "headwise", k) for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
# Each rep's ratio too: the two runs of a rep share the machine's state at that moment.
def rep_ratio(run, key):
    k, w = (next(m for m in run[i]["methods"] if m["name"] == "headwise")[key] for i in (0, 1))
    return round(k / w, 3)
print(json.dumps({"keep_rules_over_windows_prefill": round(ratio["prefill_tokens_per_s"], 3),
                  "keep_rules_over_windows_decode": round(ratio["decode_tokens_per_s"], 3), "reps": reps,
                  "per_rep_prefill": [rep_ratio(run, "prefill_tokens_per_s") for run in runs],
                  "per_rep_decode": [rep_ratio(run, "decode_tokens_per_s") for run in runs]}))
EOF
