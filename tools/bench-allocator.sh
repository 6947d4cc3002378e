#!/usr/bin/env bash
# What headwise-calc's allocator setting (core/resources: mmap threshold 256 MiB, trim threshold
# 512 MiB) is worth: each command runs twice side by side, with the setting and with glibc's
# defaults (HEADWISE_GLIBC_MALLOC_DEFAULTS=1), and the outputs must be byte-identical.
#
#   tools/bench-allocator.sh [--threads 1] [--reps 1] [--out DIR]
#
# Commands: a plain 8K-token forward of models/tiny-qwen3-next-8k, the default model's eval
# (committed 25% policy, 4 samples, full/uniform/snapkv) and its calibration (the main command's
# flags, 2 samples). Prints one JSON line per run and a markdown table of wall time, system time,
# minor page faults and peak RSS, with the ratio defaults / setting.
# HEADWISE_CALC overrides the binary (default build/bin/headwise-calc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
threads=1 reps=1 out=/tmp/headwise-bench-allocator
# shellcheck source=bench_common.sh
source "$root/tools/bench_common.sh"
bench_parse_args bench-allocator "$@"
mkdir -p "$out"
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
bench_random_tokens "$out/tokens.json" 8192

# name → command; {out} is replaced by the run's output file.
declare -A commands=(
  [forward-8k]="forward --model $root/models/tiny-qwen3-next-8k --tokens $out/tokens.json -o {out} -q"
  [eval-2k]="eval --model $root/models/tiny-qwen3-next --policy $root/policies/tiny-qwen3-next-eval-2k-25.yaml --samples 4 --tasks needle_single,needle_multikey --baselines full,uniform,snapkv --seed 23 --json --quiet"
  [calibrate-2k]="--model $root/models/tiny-qwen3-next --context 32k --budget 8m --windows 64,256,1k,full --seq-len 2k --samples 2 --seed 0 --keep-rules window -o {out} --quiet"
)
rows=()
for name in forward-8k eval-2k calibrate-2k; do
  for (( rep = 0; rep < reps; ++rep )); do
    for mode in tuned defaults; do
      file="$out/$name-$mode.out"
      cmd=${commands[$name]//\{out\}/$file}
      env_mode=()
      [[ $mode == defaults ]] && env_mode=(HEADWISE_GLIBC_MALLOC_DEFAULTS=1)
      # shellcheck disable=SC2086
      env "${env_mode[@]}" /usr/bin/time -f '%e %S %R %M' -o "$out/time" "$calc" $cmd > "$out/$name-$mode.stdout"
      [[ $name == eval-2k ]] && python3 -c "
import json, sys
j = json.load(open('$out/$name-$mode.stdout'))
for m in j['methods']:
    m.pop('prefill_tokens_per_s'); m.pop('decode_tokens_per_s')
json.dump(j, open('$file', 'w'), indent=1)"
      read -r wall sys faults max_kb < "$out/time"
      row=$(printf '{"command": "%s", "allocator": "%s", "rep": %d, "wall_s": %s, "sys_s": %s, "minor_faults": %s, "peak_rss_kib": %s}' \
        "$name" "$mode" "$rep" "$wall" "$sys" "$faults" "$max_kb")
      echo "$row"
      rows+=("$row")
    done
    cmp -s "$out/$name-tuned.out" "$out/$name-defaults.out" || { echo "bench-allocator: $name outputs differ" >&2; exit 1; }
  done
done
printf '%s\n' "${rows[@]}" | python3 "$root/tools/bench_table.py" allocator tuned defaults \
  'sys_s:sys s:1:.1f' 'minor_faults:minor faults:1:,.0f' 'peak_rss_kib:peak RSS MiB:1024:.0f'
