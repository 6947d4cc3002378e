#!/usr/bin/env bash
# How calibration cost grows with the sequence length (issue 13): the main command on the default
# model at several tokens per sequence, with wall time, peak memory and the printed plan.
#
#   tools/bench-seqlen.sh [--lengths 4k,8k,16k,32k] [--samples 2] [--out DIR] [-- calibrate flags...]
#
# Every length uses the same context (32k), budget (50% of full KV), ladder (256,1k,full: every
# level measured at every length) and the default measure, so only T changes. Prints one JSON
# line per length, then a markdown table. Peak memory is VmHWM minus the RSS before the model was
# loaded (libtorch's own footprint is outside the plan).
# HEADWISE_CALC overrides the binary (default build/bin/headwise-calc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
lengths=4k,8k,16k,32k samples=2 out=/tmp/headwise-seqlen
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
bench_flags="lengths samples out"
bench_parse_args bench-seqlen "$@"
extra=(${bench_extra[@]+"${bench_extra[@]}"})
mkdir -p "$out"
rows=()
for len in ${lengths//,/ }; do
  started=$(date +%s.%N)
  "$calc" --model "$root/models/tiny-qwen3-next" --context 32k --budget 16m --windows 256,1k,full --keep-rules window \
    --seq-len "$len" --samples "$samples" -q -o "$out/policy-$len.yaml" --report "$out/report-$len.json" "${extra[@]}"
  seconds=$(echo "$(date +%s.%N) - $started" | bc)
  row=$(python3 - "$out/report-$len.json" "$len" "$seconds" "$samples" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
m, plan = r["memory"], r["memory"]["plan"]
print(json.dumps({"seq_len": sys.argv[2], "samples": int(sys.argv[4]), "wall_seconds": round(float(sys.argv[3]), 1),
                  "seqcalib_seconds": round(r["timing"]["total_seconds"], 1), "probe_seconds": round(r["timing"]["probe_seconds"], 1),
                  "peak_rss_bytes": m["peak_rss_bytes"], "rss_before_model_bytes": plan["rss_before_model_bytes"],
                  "used_bytes": m["peak_rss_bytes"] - plan["rss_before_model_bytes"],
                  "planned_peak_bytes": plan["planned_peak_bytes"],
                  "workspace_bytes": plan["attention_workspace_bytes"], "activation_bytes": plan["activation_bytes"],
                  "measure": r["provenance"]["distortion_measure"]}))
EOF
)
  echo "$row"
  rows+=("$row")
done
printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print("| tokens per sequence | wall | SeqCalib | probe | used (peak RSS - before model) | planned peak | used / planned |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    used, planned = r["used_bytes"], r["planned_peak_bytes"]
    print("| {} x {} | {} s | {} s | {} s | {:,.0f} MiB | {:,.0f} MiB | {:.2f} |".format(
        r["seq_len"], r["samples"], r["wall_seconds"], r["seqcalib_seconds"], r["probe_seconds"],
        used / 2**20, planned / 2**20, used / planned))
'
