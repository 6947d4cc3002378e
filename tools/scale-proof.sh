#!/usr/bin/env bash
# Weights larger than the memory the process may use (issue 13): calibrate a random-weight
# checkpoint with Qwen3-Next-80B-A3B's real per-layer dimensions under a memory-cgroup cap, twice,
# and compare the policies and the peak memory with the plan the run printed.
#
#   tools/scale-proof.sh [--layers 8] [--cap 12G] [--out /tmp/headwise-scale] [-- calibrate flags...]
#
# The checkpoint (tools/make_scale_model.py; 27.6 GB bf16 at --layers 8, more than this machine's
# 24 GiB of RAM) is built on first use. The cap is a memory cgroup (v2 memory.max or v1
# memory.limit_in_bytes; needs root, or a delegated cgroup in $HEADWISE_CGROUP), so the kernel
# itself enforces it: mapped weight pages count against it and are reclaimed under it, and a run
# that needed more than the cap would be killed, not slowed. Prints one JSON line per run and a
# summary; exits non-zero if a run fails or the two policies differ.
# HEADWISE_CALC overrides the binary (default build/bin/headwise-calc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
layers=8 cap=12G out=/tmp/headwise-scale
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
bench_flags="layers cap out"
bench_parse_args scale-proof "$@"
extra=(${bench_extra[@]+"${bench_extra[@]}"})
model=$out/qwen3-next-80b-a3b-${layers}l
mkdir -p "$out"
if [[ ! -f $model/config.json ]]; then
  python3 "$root/tools/make_scale_model.py" --config "$root/tests/configs/qwen3_next_80b_a3b.json" --layers "$layers" "$model" >&2
fi

cap_bytes=$(numfmt --from=iec "$cap")
cgroup=${HEADWISE_CGROUP:-}
if [[ -z $cgroup ]]; then
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    cgroup=/sys/fs/cgroup/headwise-scale-$$
    mkdir "$cgroup" && echo "$cap_bytes" > "$cgroup/memory.max"
  elif [[ -d /sys/fs/cgroup/memory ]]; then
    cgroup=/sys/fs/cgroup/memory/headwise-scale-$$
    mkdir "$cgroup" && echo "$cap_bytes" > "$cgroup/memory.limit_in_bytes"
  else
    echo "scale-proof: no memory cgroup here; set HEADWISE_CGROUP to a writable one" >&2; exit 1
  fi
  trap 'rmdir "$cgroup" 2>/dev/null || true' EXIT
fi
# Page cache the checkpoint left from being written is charged to whoever wrote it; start cold.
sync && echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true

# The default measure (answer-tv-span) and keep rules (auto: window,h2o), as the main command runs.
flags=(--model "$model" --context 32k --budget 80m --windows 256,1k,full --seq-len 2k --samples 2
       "${extra[@]}")
# Peak anonymous memory (what the plan bounds) and peak mapped-file pages, sampled every 50 ms:
# the kernel keeps only VmHWM, which counts both.
sample_peaks() {
  local pid=$1 anon=0 file=0 a f
  while [[ -r /proc/$pid/status ]]; do
    # The process may end between the test and the read: nothing to read then, and the loop is done
    # (under set -e a failed read would end the script, as it once did after a good run).
    read -r a f < <(awk '/^RssAnon:/ {a = $2} /^RssFile:/ {f = $2} END {print a, f}' "/proc/$pid/status" 2>/dev/null || true) || break
    [[ -n $a && $a -gt $anon ]] && anon=$a
    [[ -n $f && $f -gt $file ]] && file=$f
    sleep 0.05
  done
  echo "$((anon * 1024)) $((file * 1024))"
}
for run in 1 2; do
  started=$(date +%s)
  # The shell joins the cgroup, then becomes the calibration: everything it maps or allocates is capped.
  bash -c 'echo $$ > "$1/cgroup.procs"; exec "${@:2}"' _ "$cgroup" \
    "$calc" "${flags[@]}" -o "$out/policy-$run.yaml" --report "$out/report-$run.json" -q &
  pid=$!
  sample_peaks "$pid" > "$out/peaks-$run.txt"
  wait "$pid"
  python3 - "$out/report-$run.json" "$out/peaks-$run.txt" "$cap_bytes" "$(( $(date +%s) - started ))" "$run" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
plan = report["memory"]["plan"]
anon, mapped = (int(x) for x in open(sys.argv[2]).read().split())
before = plan["rss_before_model_bytes"]
print(json.dumps({"run": int(sys.argv[5]), "seconds": int(sys.argv[4]), "cap_bytes": int(sys.argv[3]),
                  "planned_peak_bytes": plan["planned_peak_bytes"], "rss_before_model_bytes": before,
                  "peak_anon_bytes": anon, "peak_mapped_file_bytes": mapped,
                  "planned_mapped_bytes": plan["mapped_weight_bytes"], "vm_hwm_bytes": report["memory"]["peak_rss_bytes"],
                  "anon_over_plan": round((anon - before) / plan["planned_peak_bytes"], 3),
                  "available_bytes_seen": plan["available_bytes"], "global_bytes": report["global_bytes"]}))
EOF
done
if cmp -s "$out/policy-1.yaml" "$out/policy-2.yaml"; then
  echo "scale-proof: the two policies are byte-identical ($(du -b "$out/policy-1.yaml" | cut -f1) bytes); checkpoint $(du -sb "$model" | cut -f1) bytes, cap $cap_bytes bytes"
else
  echo "scale-proof: the two policies differ" >&2; diff "$out/policy-1.yaml" "$out/policy-2.yaml" >&2; exit 1
fi
