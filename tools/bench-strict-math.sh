#!/usr/bin/env bash
# What headwise's reproducible CPU math (core/reproducible_math, set when libheadwise loads)
# costs, mode by mode, each command run side by side in every mode:
#   pinned       the default: MKL's strict AVX2 branch, ATen's avx2 kernels, oneDNN up to AVX2 (the
#                same policy bytes on every x86-64 CPU with AVX2, docs/hardening.md)
#   compatible   HEADWISE_MKL_BRANCH=COMPATIBLE: MKL's SSE2 branch instead (the same bytes on
#                non-Intel CPUs too, where MKL's named branches fall back to AUTO)
#   auto-strict  before issue 53: MKL_CBWR=AUTO,STRICT, ATen and oneDNN on this CPU's own paths
#                (HEADWISE_MKL_STRICT=0 with MKL_CBWR set here)
#   default      MKL's defaults, nothing pinned (HEADWISE_MKL_STRICT=0)
#   no-avx2      what a pin that also covered CPUs without AVX2 would cost (not a setting of
#                headwise): MKL's strict SSE2 branch, ATen's plain kernels, oneDNN up to SSE4.1
# Outputs differ in the last bits between modes; each mode's output is checked to be the same at 1
# and at --threads threads (every mode but default should be).
#
#   tools/bench-strict-math.sh [--threads 2] [--reps 1] [--out DIR] [--modes "pinned default"]
#                              [--commands "forward-8k calibrate-2k main"]
#
# Commands: a plain 8K-token forward of models/tiny-qwen3-next-8k, the default model's calibration
# at 2K (2 samples) and the main command's calibration (tools/run-default.sh's flags). Prints one
# JSON line per run (wall and CPU seconds) and a markdown table of wall time per mode against the
# first mode listed. HEADWISE_CALC overrides the binary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
threads=2 reps=1 out=/tmp/headwise-bench-strict-math
modes="pinned compatible auto-strict default" commands="forward-8k calibrate-2k main"
bench_flags="threads reps out modes commands"
# shellcheck source=bench_common.sh
source "$root/tools/bench_common.sh"
bench_parse_args bench-strict-math "$@"
mkdir -p "$out"
bench_random_tokens "$out/tokens.json" 8192

declare -A command_lines=(
  [forward-8k]="forward --model $root/models/tiny-qwen3-next-8k --tokens $out/tokens.json -o {out} -q"
  [calibrate-2k]="--model $root/models/tiny-qwen3-next --context 32k --budget 8m --windows 64,256,1k,full --seq-len 2k --samples 2 --seed 0 --keep-rules window -o {out} --quiet"
  [main]="--model $root/models/tiny-qwen3-next-8k --context 4k --budget 2084k --windows 128,512,2k,full --samples 8 --seed 0 --state-dtype native -o {out} --quiet"
)
# Every run starts from none of the libraries' own variables, whatever the shell exported.
unpinned=(-u MKL_CBWR -u ATEN_CPU_CAPABILITY -u ONEDNN_MAX_CPU_ISA -u HEADWISE_MKL_BRANCH -u HEADWISE_MKL_STRICT)
declare -A mode_env=(
  [pinned]=""
  [compatible]="HEADWISE_MKL_BRANCH=COMPATIBLE"
  [auto-strict]="HEADWISE_MKL_STRICT=0 MKL_CBWR=AUTO,STRICT"
  [default]="HEADWISE_MKL_STRICT=0"
  [no-avx2]="HEADWISE_MKL_STRICT=0 MKL_CBWR=COMPATIBLE,STRICT ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41"
)
rows=()
for name in $commands; do
  [[ -n ${command_lines[$name]+set} ]] || { echo "bench-strict-math: unknown command $name" >&2; exit 2; }
  for (( rep = 0; rep < reps; ++rep )); do
    for mode in $modes; do
      [[ -n ${mode_env[$mode]+set} ]] || { echo "bench-strict-math: unknown mode $mode" >&2; exit 2; }
      for n in "$threads" 1; do
        file="$out/$name-$mode-$n.out"
        cmd=${command_lines[$name]//\{out\}/$file}
        # shellcheck disable=SC2086
        env "${unpinned[@]}" ${mode_env[$mode]} OMP_NUM_THREADS=$n \
          /usr/bin/time -f '%e %U %S' -o "$out/time" "$calc" $cmd > /dev/null
        [[ $n == 1 ]] && continue  # the 1-thread run only checks the bits
        read -r wall user sys < "$out/time"
      done
      same=false
      cmp -s "$out/$name-$mode-$threads.out" "$out/$name-$mode-1.out" && same=true
      row=$(printf '{"command": "%s", "math": "%s", "rep": %d, "wall_s": %s, "cpu_s": %.2f, "same_bits_at_1_thread": %s}' \
        "$name" "$mode" "$rep" "$wall" "$(echo "$user + $sys" | bc)" "$same")
      echo "$row"
      rows+=("$row")
    done
  done
done
read -r -a listed <<< "$modes"
for mode in "${listed[@]:1}"; do
  printf '%s\n' "${rows[@]}" | python3 "$root/tools/bench_table.py" math "${listed[0]}" "$mode" cpu_s:cpu_s:1:.1f
done
