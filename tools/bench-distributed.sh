#!/usr/bin/env bash
# What data-parallel calibration buys on this machine (issue 17): the main command on the default
# model run as one process and as 2 processes on localhost (the launch torchrun would make: the
# same flags, --rank 0/1), side by side in one run.
#
#   tools/bench-distributed.sh [--samples 4] [--seq-len 2k] [--distortion answer-kl] [--out DIR]
#
# Three runs over the same sequences (--micro-batch 1, so each rank gets whole sequences):
#   one-1t   1 process x 1 thread   (the reference the 2-rank policy must equal byte for byte)
#   one-2t   1 process x 2 threads  (what one process gets from both cores)
#   two-1t   2 processes x 1 thread (both cores, data parallel)
# Prints one JSON object: wall seconds, speedups two-1t/one-1t and two-1t/one-2t, whether the
# policies are byte-identical, and the bytes rank 0 sent per global layer (from its report).
# HEADWISE_CALC overrides the binary (default build/bin/headwise-calc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
samples=4 seq_len=2k distortion=answer-kl out=/tmp/headwise-bench-distributed
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
bench_flags="samples seq-len distortion out"
bench_parse_args bench-distributed "$@"
mkdir -p "$out"
# Window rules: the keep-rules pass is not sharded across ranks, and this measures what is.
args=(--model "$root/models/tiny-qwen3-next" --context 2k --budget 1m --windows 64,256,1k,full
      --samples "$samples" --seq-len "$seq_len" --micro-batch 1 --distortion "$distortion" --keep-rules window -q)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

now() { date +%s.%N; }
elapsed() { echo "$(now) - $1" | bc; }

t=$(now); OMP_NUM_THREADS=1 "$calc" "${args[@]}" -o "$out/one-1t.yaml" --report "$out/one-1t.json"; one_1t=$(elapsed "$t")
t=$(now); OMP_NUM_THREADS=2 "$calc" "${args[@]}" -o "$out/one-2t.yaml" --report "$out/one-2t.json"; one_2t=$(elapsed "$t")
t=$(now)
OMP_NUM_THREADS=1 "$calc" "${args[@]}" -o "$out/two-1t.yaml" --report "$out/two-1t.json" \
  --world-size 2 --rank 0 --master-port "$port" & r0=$!
OMP_NUM_THREADS=1 "$calc" "${args[@]}" -o "$out/two-1t.yaml" --world-size 2 --rank 1 --master-port "$port" & r1=$!
wait $r0; wait $r1
two_1t=$(elapsed "$t")

python3 - "$out" "$one_1t" "$one_2t" "$two_1t" "$samples" "$seq_len" "$distortion" <<'PY'
import json, sys
out, one_1t, one_2t, two_1t = sys.argv[1], *map(float, sys.argv[2:5])
read = lambda name: open(f"{out}/{name}", "rb").read()
report = json.load(open(f"{out}/two-1t.json"))
per_layer = {str(l["layer_id"]): l["exchanged_bytes"] for l in report["layers"] if "exchanged_bytes" in l}
print(json.dumps({
    "model": "models/tiny-qwen3-next", "samples": int(sys.argv[5]), "seq_len": sys.argv[6], "distortion": sys.argv[7],
    "wall_seconds": {"one_process_1_thread": round(one_1t, 1), "one_process_2_threads": round(one_2t, 1),
                     "two_processes_1_thread": round(two_1t, 1)},
    "speedup_two_over_one_1_thread": round(one_1t / two_1t, 2),
    "speedup_two_over_one_2_threads": round(one_2t / two_1t, 2),
    "policy_identical_to_one_process_1_thread": read("two-1t.yaml") == read("one-1t.yaml"),
    "exchanged_bytes_rank0_total": report["distributed"]["exchanged_bytes"],
    "exchanged_bytes_rank0_per_global_layer": per_layer,
}, indent=1))
PY
