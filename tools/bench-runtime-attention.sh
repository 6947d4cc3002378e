#!/usr/bin/env bash
# What the runtime decoder's fused attention (arch::fused_masked_attention: ATen's flash attention
# on CPU) is worth against the explicit matmul/mask/softmax path it replaced: each command runs
# with --runtime-attention fused and explicit, one after the other, and the two results are
# compared (they differ only by float rounding, so the check is agreement, not equality).
#
#   tools/bench-runtime-attention.sh [--threads 1] [--reps 1] [--samples 4] [--out DIR]
#
# Commands, on models/tiny-qwen3-next-8k with a 25% policy calibrated first (2 samples, not timed):
#   forward-8k  `forward --policy` over 8192 tokens: logits compared (max |diff|, argmax agreement,
#               largest per-position KL between the two);
#   eval-8k     `eval` at 8K of full, the policy, uniform and the SnapKV, H2O and AdaKV rules on the
#               policy's slots (`*-headwise-slots`) on `--samples`
#               samples per needle task: every accuracy must be equal, KLs are printed side by side;
#   duo-8k      `eval` at 8K with only the duo baseline, its gate training cut to 8 steps on 2
#               samples (at its default 256 steps it is the longest part of an 8K eval); duo's
#               windows are printed side by side (trained gates may differ in the last bits).
# and eval-2k: the default model's committed 25% policy at 2K, same methods.
# Prints one JSON line per run and a markdown table (wall time, speed-up explicit / fused).
# HEADWISE_CALC overrides the binary (default build/bin/headwise-calc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calc=${HEADWISE_CALC:-$root/build/bin/headwise-calc}
threads=1 reps=1 samples=4 out=/tmp/headwise-bench-runtime-attention
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
bench_flags="threads reps samples out"
bench_parse_args bench-runtime-attention "$@"
mkdir -p "$out"
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
model8k=$root/models/tiny-qwen3-next-8k
bench_random_tokens "$out/tokens.json" 8192
policy8k=$out/policy-8k-25.yaml
if [[ ! -f $policy8k ]]; then
  # 25% of full KV's global bytes at 8K (2,134,016 of 8,536,064), the ladder of the 8K evidence run.
  "$calc" --model "$model8k" --context 8k --budget 2134016 --windows 256,1k,4k,full --samples 2 --seed 0 --keep-rules window \
    -o "$policy8k" --quiet
fi
# The eviction rules on the policy's own slots: what these figures were measured with when the
# names snapkv, h2o and adakv meant it (issue 41 gave those names the published allocations).
methods=full,uniform,snapkv-headwise-slots,h2o-headwise-slots,adakv-headwise-slots
declare -A commands=(
  [forward-8k]="forward --model $model8k --tokens $out/tokens.json --policy $policy8k -o {out} -q"
  [eval-8k]="eval --model $model8k --policy $policy8k --samples $samples --tasks needle_single,needle_multikey --baselines $methods --seed 23 --json --quiet"
  [duo-8k]="eval --model $model8k --policy $policy8k --samples 1 --tasks needle_single,needle_multikey --baselines duo --duo-steps 8 --calib-samples 1 --seed 23 --json --quiet"
  [eval-2k]="eval --model $root/models/tiny-qwen3-next --policy $root/policies/tiny-qwen3-next-eval-2k-25.yaml --samples $samples --tasks needle_single,needle_multikey --baselines $methods --seed 23 --json --quiet"
)
rows=()
for name in forward-8k eval-8k duo-8k eval-2k; do
  for (( rep = 0; rep < reps; ++rep )); do
    for kernel in fused explicit; do
      file="$out/$name-$kernel.out"
      cmd=${commands[$name]//\{out\}/$file}
      # shellcheck disable=SC2086
      /usr/bin/time -f '%e %M' -o "$out/time" "$calc" $cmd --runtime-attention "$kernel" > "$out/$name-$kernel.stdout"
      [[ $name != forward-* ]] && cp "$out/$name-$kernel.stdout" "$file"
      read -r wall max_kb < "$out/time"
      row=$(printf '{"command": "%s", "attention": "%s", "rep": %d, "wall_s": %s, "peak_rss_kib": %s}' \
        "$name" "$kernel" "$rep" "$wall" "$max_kb")
      echo "$row"
      rows+=("$row")
    done
    python3 - "$name" "$out/$name-fused.out" "$out/$name-explicit.out" <<'EOF'
import json, sys
name, fused, explicit = sys.argv[1:]
if name.startswith("forward"):
    from safetensors.torch import load_file
    a, b = load_file(fused)["logits"], load_file(explicit)["logits"]
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    kl = (lb.exp() * (lb - la)).sum(-1)
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(json.dumps({"command": name, "max_abs_logit_diff": (a - b).abs().max().item(),
                      "logit_scale": b.abs().max().item(), "argmax_agreement": agree, "max_kl": kl.max().item()}))
    sys.exit(0 if agree > 0.999 else 1)
a, b = json.load(open(fused)), json.load(open(explicit))
ok = True
for ma, mb in zip(a["methods"], b["methods"]):
    same = ma["tasks"] == mb["tasks"] and ma["windows"] == mb["windows"] and \
        ma["cache_bytes_measured"] == mb["cache_bytes_measured"] == mb["cache_bytes_estimated"]
    row = {"command": name, "method": ma["name"], "same_accuracy_windows_bytes": same,
           "kl_fused": ma["kl_vs_full"], "kl_explicit": mb["kl_vs_full"]}
    if ma["name"] == "duo":
        row.update(windows_fused=ma["windows"], windows_explicit=mb["windows"])
    else:
        ok &= same
    print(json.dumps(row))
sys.exit(0 if ok else 1)
EOF
  done
done
printf '%s\n' "${rows[@]}" | python3 "$root/tools/bench_table.py" attention fused explicit \
  'peak_rss_kib:peak RSS MiB:1024:.0f'
