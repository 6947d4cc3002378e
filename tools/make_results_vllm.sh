#!/usr/bin/env bash
# The "Calibrated for vLLM" section of docs/results.md (issue 54), and only it: today's policy a
# vLLM user can serve (the main command with --keep-rules window, 50% of full KV's global bytes in
# headwise's count) against the main command with --engine vllm at the same vLLM reservation, at
# max_num_batched_tokens 2048 (vLLM's default below 70 GiB) and 512, in one eval (the same samples;
# full KV is the reference). Writes out/results-vllm/*.yaml and replaces the section between its
# markers in docs/results.md; the rest of the file is tools/make_results.sh's.
#   SAMPLES=30 (per task: 17 min here with --jobs 2; eval's default is 100, about 1 h for these four methods on this 2-core
#   machine)  MODEL=models/tiny-qwen3-next-8k  HEADWISE_CALC=build/bin/headwise-calc
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=${HEADWISE_CALC:-build/bin/headwise-calc}
model=${MODEL:-models/tiny-qwen3-next-8k}
samples=${SAMPLES:-30}
out=out/results-vllm
mkdir -p "$out"
common=(--model "$model" --context 4k --windows 128,512,2k,full --samples 8 --seed 0 --state-dtype native)
"$bin" "${common[@]}" --budget 2134016 --keep-rules window -o "$out/today-50.yaml" --quiet
commands=("$bin ${common[*]} --budget 2134016 --keep-rules window -o $out/today-50.yaml")
for chunk in 2048 512; do
  bytes=$("$bin" mem-estimate --config "$out/today-50.yaml" --engine vllm --block-size 16 \
    --max-num-batched-tokens "$chunk" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total_bytes"])')
  "$bin" "${common[@]}" --budget "$bytes" --engine vllm --max-num-batched-tokens "$chunk" \
    -o "$out/vllm-$chunk.yaml" --quiet
  commands+=("$bin ${common[*]} --budget $bytes --engine vllm --max-num-batched-tokens $chunk -o $out/vllm-$chunk.yaml")
done
evaluate=("$bin" eval --model "$model" --policy "$out/today-50.yaml" --policy "$out/vllm-2048.yaml"
          --policy "$out/vllm-512.yaml" --samples "$samples" --seed 23 --baselines full --json --quiet --jobs 2)
"${evaluate[@]}" > "$out/eval.json"
commands+=("${evaluate[*]}")
python3 tools/results_vllm.py --bin "$bin" --eval "$out/eval.json" --policies "$out/today-50.yaml" \
  "$out/vllm-2048.yaml" "$out/vllm-512.yaml" --commands "${commands[@]}" --results docs/results.md
