#!/usr/bin/env bash
# What MKL's strict reproducibility mode (core/reproducible_math: MKL_CBWR=AUTO,STRICT, set when
# libheadwise loads, so a GEMM's bits do not depend on the thread count) costs: each command
# runs side by side in strict mode and in MKL's default mode (HEADWISE_MKL_STRICT=0). Outputs
# differ in the last bits between the modes; each mode's output is checked to be the same at 1
# and at --threads threads only in strict mode (the point of it).
#
#   tools/bench-strict-math.sh [--threads 2] [--reps 1] [--out DIR]
#
# Commands: a plain 8K-token forward of models/tiny-qwen3-next-8k and the default model's
# calibration (the main command's flags, 2 samples). Prints one JSON line per run and a markdown
# table of wall time with the ratio default / strict. HEADWISE_CALC overrides the binary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
threads=2 reps=1 out=/tmp/headwise-bench-strict-math
# shellcheck source=bench_common.sh
source "$root/tools/bench_common.sh"
bench_parse_args bench-strict-math "$@"
mkdir -p "$out"
bench_random_tokens "$out/tokens.json" 8192

declare -A commands=(
  [forward-8k]="forward --model $root/models/tiny-qwen3-next-8k --tokens $out/tokens.json -o {out} -q"
  [calibrate-2k]="--model $root/models/tiny-qwen3-next --context 32k --budget 8m --windows 64,256,1k,full --seq-len 2k --samples 2 --seed 0 --keep-rules window -o {out} --quiet"
)
rows=()
for name in forward-8k calibrate-2k; do
  for (( rep = 0; rep < reps; ++rep )); do
    for mode in strict default; do
      flag=1
      [[ $mode == default ]] && flag=0
      for n in "$threads" 1; do
        file="$out/$name-$mode-$n.out"
        cmd=${commands[$name]//\{out\}/$file}
        # shellcheck disable=SC2086
        HEADWISE_MKL_STRICT=$flag OMP_NUM_THREADS=$n /usr/bin/time -f '%e' -o "$out/time" "$calc" $cmd > /dev/null
        [[ $n == 1 ]] && continue  # the 1-thread run only checks the bits
        read -r wall < "$out/time"
      done
      same=false
      cmp -s "$out/$name-$mode-$threads.out" "$out/$name-$mode-1.out" && same=true
      row=$(printf '{"command": "%s", "math": "%s", "rep": %d, "wall_s": %s, "same_bits_at_1_thread": %s}' \
        "$name" "$mode" "$rep" "$wall" "$same")
      echo "$row"
      rows+=("$row")
    done
  done
done
printf '%s\n' "${rows[@]}" | python3 "$root/tools/bench_table.py" math strict default
