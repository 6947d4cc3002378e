#!/usr/bin/env bash
# Byte-identity check for restructurings of the calibration code: runs one calibration per measure
# and path (every distortion measure, validation, the re-solve by re-walk, no conditioning, keep
# rules, several micro-batches, power-law extrapolation, a sliding-window model, resume) with the
# given headwise-calc, and writes each policy and report into OUT. `--compare A B` then says
# whether two such folders hold the same policies and the same reports, timings aside.
#
#   tools/compare-calibrations.sh run CLI OUT        # e.g. run /tmp/before/headwise-calc /tmp/a
#   tools/compare-calibrations.sh compare A B
#
# Every run is at one intra-op thread (the policies' bytes do not depend on it, docs/hardening.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

runs() {  # name|model|arguments
  local fx=$root/tests/fixtures
  local small="--context 512 --windows 8,32,full --seq-len 96 --samples 4 --budget 24k"
  cat <<EOF
block-mse|$fx/qwen3_next_tiny|$small --distortion block-mse
block-mse-micro|$fx/qwen3_next_tiny|$small --distortion block-mse --micro-batch 2
block-mse-unconditioned|$fx/qwen3_next_tiny|$small --distortion block-mse --no-conditioning
answer-kl|$fx/qwen3_next_tiny|$small --distortion answer-kl --keep-rules window
answer-tv|$fx/qwen3_next_tiny|$small --distortion answer-tv
answer-tv-independent|$fx/qwen3_next_tiny|$small --distortion answer-tv --independent-heads
answer-tv-unconditioned|$fx/qwen3_next_tiny|$small --distortion answer-tv --no-conditioning
answer-grad|$fx/qwen3_next_tiny|$small --distortion answer-grad --keep-rules window
answer-grad-validate|$fx/qwen3_next_tiny|$small --distortion answer-grad --validate-measure --keep-rules window
answer-tv-span|$fx/qwen3_next_tiny|$small --distortion answer-tv-span
answer-kl-span-validate|$fx/qwen3_next_tiny|$small --distortion answer-kl-span --validate-measure
answer-tv-span-rewalk|$fx/qwen3_next_tiny|$small --distortion answer-tv-span --re-solve-by-rewalk
answer-tv-span-unconditioned|$fx/qwen3_next_tiny|$small --distortion answer-tv-span --no-conditioning
answer-tv-span-micro|$fx/qwen3_next_tiny|$small --distortion answer-tv-span --micro-batch 2
answer-tv-span-window|$fx/qwen3_next_tiny|$small --distortion answer-tv-span --keep-rules window
answer-tv-span-extrapolate|$fx/qwen3_next_tiny|--context 512 --windows 8,32,128,full --seq-len 96 --samples 4 --budget 24k --extrapolate power-law
gemma3-span|$fx/gemma3_gqa4|--context 512 --windows 8,32,full --seq-len 96 --samples 4 --budget 60k
gemma3-block-mse|$fx/gemma3_gqa4|--context 512 --windows 8,32,full --seq-len 96 --samples 4 --budget 60k --distortion block-mse
default-model-2k|$root/models/tiny-qwen3-next|--context 2k --windows 64,256,1k,full --samples 4 --budget 1100k --state-dtype native
default-model-2k-rewalk|$root/models/tiny-qwen3-next|--context 2k --windows 64,256,1k,full --samples 4 --budget 1100k --state-dtype native --re-solve-by-rewalk
default-model-2k-kl|$root/models/tiny-qwen3-next|--context 2k --windows 64,256,1k,full --samples 4 --budget 900k --state-dtype native --distortion answer-kl --keep-rules window --seq-len 1536
default-model-2k-tv|$root/models/tiny-qwen3-next|--context 2k --windows 64,256,1k,full --samples 4 --budget 700k --state-dtype native --distortion answer-tv --keep-rules window
EOF
}

run_all() {
  local cli=$1 out=$2
  mkdir -p "$out"
  while IFS='|' read -r name model args; do
    # shellcheck disable=SC2086
    if ! OMP_NUM_THREADS=1 "$cli" --model "$model" $args --seed 3 -q -o "$out/$name.yaml" \
      --report "$out/$name.json" 2>"$out/$name.err"; then
      echo "$name: exit $? ($(tail -1 "$out/$name.err"))"
    else
      echo "$name: ok"
    fi
  done < <(runs)
}

# A report without what depends on the clock or the machine's load.
normalised_report() {
  python3 - "$1" <<'PY'
import json, sys
SKIP = {"seconds", "probe_seconds", "total_seconds", "peak_rss_bytes", "peak_device_bytes",
        "calibration_seconds", "wall_seconds", "solve_ms", "elapsed_seconds", "timing",
        "available_bytes", "rss_before_model_bytes", "model_path", "inputs_sha256"}
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in SKIP and not k.endswith("_seconds")}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
print(json.dumps(strip(json.load(open(sys.argv[1]))), indent=1, sort_keys=True))
PY
}

compare() {
  local a=$1 b=$2 failed=0
  while IFS='|' read -r name _ _; do
    if [[ ! -f $a/$name.yaml || ! -f $b/$name.yaml ]]; then
      if [[ -f $a/$name.yaml || -f $b/$name.yaml ]]; then
        echo "DIFF $name: a policy on one side only"; failed=1
      elif ! cmp -s <(tail -1 "$a/$name.err") <(tail -1 "$b/$name.err"); then
        echo "DIFF $name: both failed, with different errors"; failed=1
      else
        echo "same $name (both refused: $(tail -1 "$a/$name.err"))"
      fi
      continue
    fi
    # A policy records the model's path relative to itself, and the inputs hash covers it: runs
    # from two checkouts differ in those two lines only.
    if ! cmp -s <(grep -v '^model_path:\|^  inputs_sha256:' "$a/$name.yaml") \
      <(grep -v '^model_path:\|^  inputs_sha256:' "$b/$name.yaml"); then
      echo "DIFF $name: policy"; diff "$a/$name.yaml" "$b/$name.yaml" | head -20 || true; failed=1
    elif ! cmp -s <(normalised_report "$a/$name.json") <(normalised_report "$b/$name.json"); then
      echo "DIFF $name: report"
      diff <(normalised_report "$a/$name.json") <(normalised_report "$b/$name.json") | head -20 || true
      failed=1
    elif ! cmp -s "$a/$name.yaml" "$b/$name.yaml"; then
      echo "same $name (but for model_path and the inputs hash: another checkout)"
    else
      echo "same $name"
    fi
  done < <(runs)
  return $failed
}

case ${1:-} in
  run) run_all "$2" "$3" ;;
  compare) compare "$2" "$3" ;;
  *) echo "usage: $0 run CLI OUT | compare A B" >&2; exit 2 ;;
esac
