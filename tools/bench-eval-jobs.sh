#!/usr/bin/env bash
# What `eval --jobs 2` is worth on this machine's cores: the same eval (the default model's two
# committed budgets, every method) runs side by side as
#   jobs2   --jobs 2, one intra-op thread per job (the methods run two at a time),
#   jobs1   --jobs 1 at 2 intra-op threads (what one process did before),
#   jobs1t1 --jobs 1 at 1 intra-op thread (the jobs' own thread count),
# and jobs2's figures must equal jobs1t1's byte for byte (throughput fields aside): the schedule
# changes when a method runs, never what it computes. jobs1's figures come from another thread
# count, so only its accuracies are compared (a difference is printed, not an error).
#
#   tools/bench-eval-jobs.sh [--samples 10] [--duo-steps 32] [--reps 1] [--out DIR]
#
# Prints one JSON line per run and a markdown table: wall time, speed-up jobs1 / jobs2, peak RSS.
# HEADWISE_CALC overrides the binary (default build/bin/headwise-calc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
samples=10 duo_steps=32 reps=1 out=/tmp/headwise-bench-eval-jobs
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
bench_flags="samples duo-steps reps out"
bench_parse_args bench-eval-jobs "$@"
mkdir -p "$out"
p=$root/policies/tiny-qwen3-next-eval-2k
cmd="eval --model $root/models/tiny-qwen3-next --policy $p-25.yaml --policy $p-50.yaml
     --unconditioned-policy $p-25-unconditioned.yaml --unconditioned-policy $p-50-unconditioned.yaml
     --samples $samples --duo-steps $duo_steps --seed 23 --json --quiet"

# Drops the throughput fields, which are timings, so the rest can be compared byte for byte.
strip_timings() {
  python3 - "$1" "$2" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for e in doc["evaluations"]:
    for m in e["methods"]:
        m.pop("prefill_tokens_per_s"); m.pop("decode_tokens_per_s")
json.dump(doc, open(sys.argv[2], "w"), indent=1, sort_keys=True)
PY
}

rows=()
for (( rep = 0; rep < reps; ++rep )); do
  for mode in jobs2 jobs1 jobs1t1; do
    case $mode in
      jobs2) threads=2 jobs=2 ;;
      jobs1) threads=2 jobs=1 ;;
      jobs1t1) threads=1 jobs=1 ;;
    esac
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads /usr/bin/time -f '%e %M' -o "$out/time" \
      "$calc" $cmd --jobs $jobs > "$out/$mode.json"
    strip_timings "$out/$mode.json" "$out/$mode.figures.json"
    read -r wall max_kb < "$out/time"
    row=$(printf '{"command": "eval-2k-2budgets", "schedule": "%s", "rep": %d, "wall_s": %s, "peak_rss_kib": %s}' \
      "$mode" "$rep" "$wall" "$max_kb")
    echo "$row"
    rows+=("$row")
  done
  cmp -s "$out/jobs2.figures.json" "$out/jobs1t1.figures.json" ||
    { echo "bench-eval-jobs: --jobs 2 and --jobs 1 at one thread give different figures" >&2; exit 1; }
  python3 - "$out/jobs2.figures.json" "$out/jobs1.figures.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
for ea, eb in zip(a["evaluations"], b["evaluations"]):
    for ma, mb in zip(ea["methods"], eb["methods"]):
        if ma["tasks"] != mb["tasks"]:
            # Not an error: another thread count may round differently and flip a near-tie.
            print(f"bench-eval-jobs: note: {ma['name']} accuracies differ between 1 and 2 threads: "
                  f"{ma['tasks']} vs {mb['tasks']}", file=sys.stderr)
PY
done
printf '%s\n' "${rows[@]}" | python3 "$root/tools/bench_table.py" schedule jobs2 jobs1 'peak_rss_kib:peak RSS MiB:1024:.0f'
