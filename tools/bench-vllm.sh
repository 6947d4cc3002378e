#!/usr/bin/env bash
# vLLM with and without a headwise policy on one model, side by side in one run. Two modes:
#
#   tools/bench-vllm.sh [--threads 1] [--reps 2] [--out DIR]
# Throughput: prefill and decode tokens/s, KV bytes per max-length request and maximum concurrency
# as vLLM reports them (tools/bench_vllm.py; the two engines alternate in one process, --reps
# rounds of each, three measurements per engine and round; rates as median and best), on the
# Gemma-3-layout model below.
#
#   tools/bench-vllm.sh --load [--layout qwen3-next|gemma3] [--requests 32] [--prompt-tokens 3072]
#       [--gen-tokens 128] [--kv-cache-mib 256] [--max-model-len 4096] [--max-num-batched-tokens 512]
#       [--threads 1] [--out DIR]
# Concurrency under load (tools/bench_vllm_load.py): --requests long requests at once against a
# fixed KV pool of --kv-cache-mib MiB (vLLM's kv_cache_memory_bytes, the setting
# VLLM_CPU_KVCACHE_SPACE makes in whole GiB: a tiny model needs less than 1 GiB to run short of
# blocks), without and then with the policy in one process: peak and mean running requests from
# vLLM's scheduler stats, preemptions, wall time, output tokens/s, and mem-estimate's predicted
# ratio of max-length requests. Needs build/bin/headwise-calc.
#
# One thread by default: vLLM binds its OpenMP threads, and on this shared 2-core machine two
# threads spin at every op's barrier (measured: 8 requests x 32 decoded tokens took 17.7 s at 2
# threads, 0.95 s at 1, the same run).
#
# The models (made once into models/bench-vllm-*/, random weights, bf16; policies hand-written,
# not calibrated: this measures serving, not quality):
#   gemma3: Gemma-3 layout, 6 layers (sliding window 512 on 4, global on 2), 8 query / 4 KV heads
#     of 64, hidden 512, vocab 4096. Policy: layer 2 [512, 512, 1024, full], layer 5 [512, 2048,
#     full, full].
#   qwen3-next: Qwen3-Next layout, 8 layers (gated DeltaNet on 6, gated attention on layers 3 and 7,
#     as the 80B's 3:1), 16 query / 8 KV heads of 128, linear heads of 128 (1 key, 2 value), a
#     top-2 MoE of 8 experts with a shared expert, hidden 256, vocab 4096. Policy: layer 3
#     [512 x 4, 2048 x 2, full x 2], layer 7 [512 x 6, full x 2].
# Throughput mode: max_model_len 8192, max_num_batched_tokens 512 (a sliding head reserves W - 1 +
# 512 tokens), bf16, eager, 1 GiB KV pool (VLLM_CPU_KVCACHE_SPACE). Prefill: 2 prompts of 4096
# tokens; decode: 8 prompts of 256 tokens, 64 new tokens each.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
threads=1 reps=2 out=/tmp/headwise-bench-vllm
load=0 layout=qwen3-next requests=32 prompt_tokens=3072 gen_tokens=128 kv_cache_mib=256 max_model_len=4096
max_num_batched_tokens=512
bench_flags="threads reps out layout requests prompt-tokens gen-tokens kv-cache-mib max-model-len max-num-batched-tokens"
bench_switches="load"
bench_parse_args bench-vllm "$@"
mkdir -p "$out"
"$root/tools/setup.sh" --vllm >/dev/null
py=$root/.venv-vllm/bin/python

# write_policy MODEL POLICY WINDOWS...: a policy for MODEL, each WINDOWS argument "LAYER:w,w,...".
write_policy() {
  "$py" - "$@" <<'PY'
import hashlib, pathlib, sys
model, policy = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
config = (model / "config.json").read_bytes()
lines = ["schema: headwise/policy/v1", f'model_name: "{model.name}"', f'model_path: "{model}"',
         "model_fingerprint:", f"  config_sha256: {hashlib.sha256(config).hexdigest()}", "budget_gb: 0",
         "context: 8192", "batch: 1", "dtype: bfloat16", "block_size: 16", "sink_tokens: 0",
         "window_levels: [512, 1024, 2048, full]", "per_layer_policies:"]
for spec in sys.argv[3:]:
    layer, windows = spec.split(":")
    lines += [f"  - layer_id: {layer}", f"    kv_head_windows: [{windows.replace(',', ', ')}]"]
policy.write_text("\n".join(lines) + "\n")
PY
}

make_gemma3() {
  "$py" - "$1" <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
kinds = ["sliding_attention", "sliding_attention", "full_attention"] * 2
config = AutoConfig.for_model("gemma3_text", vocab_size=4096, hidden_size=512, intermediate_size=1024,
                              num_hidden_layers=6, layer_types=kinds, num_attention_heads=8, num_key_value_heads=4,
                              head_dim=64, query_pre_attn_scalar=64, sliding_window=512,
                              max_position_embeddings=16384, rope_theta=1e6, rope_local_base_freq=1e4)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
PY
}

make_qwen3_next() {
  "$py" - "$1" <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.for_model(
    "qwen3_next", vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
    full_attention_interval=4, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
    decoder_sparse_step=1, max_position_embeddings=16384, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(sys.argv[1], safe_serialization=True)
PY
}

if ((load)); then
  cli=$root/build/bin/headwise-calc
  [[ -x $cli ]] || { echo "bench-vllm: --load needs $cli (tools/build.sh)" >&2; exit 1; }
  case $layout in
    qwen3-next)
      model=$root/models/bench-vllm-qwen3-next
      [[ -f $model/config.json ]] || make_qwen3_next "$model"
      policy=$out/bench-vllm-qwen3-next.yaml
      write_policy "$model" "$policy" "3:512,512,512,512,2048,2048,full,full" "7:512,512,512,512,512,512,full,full" ;;
    gemma3)
      model=$root/models/bench-vllm-gemma3
      [[ -f $model/config.json ]] || make_gemma3 "$model"
      policy=$out/bench-vllm-gemma3.yaml
      write_policy "$model" "$policy" "2:512,512,1024,full" "5:512,2048,full,full" ;;
    *) echo "bench-vllm: --layout $layout: expected qwen3-next or gemma3" >&2; exit 2 ;;
  esac
  bench_random_tokens "$out/tokens.json" 16
  export OMP_NUM_THREADS=$threads VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-auto}
  unset VLLM_CPU_KVCACHE_SPACE  # the pool is --kv-cache-mib
  "$py" "$root/tools/bench_vllm_load.py" --model "$model" --policy "$policy" --cli "$cli" \
    --requests "$requests" --prompt-tokens "$prompt_tokens" --gen-tokens "$gen_tokens" \
    --max-model-len "$max_model_len" --max-num-batched-tokens "$max_num_batched_tokens" \
    --kv-cache-bytes $((kv_cache_mib * 1048576)) --tokens-file "$out/tokens.json" \
    --json-out "$out/bench-vllm-load-$layout.json" 2>"$out/bench-vllm-load-$layout.log"
  echo "(details: $out/bench-vllm-load-$layout.json, vLLM's log: $out/bench-vllm-load-$layout.log)"
  exit 0
fi

model=$root/models/bench-vllm-gemma3
[[ -f $model/config.json ]] || make_gemma3 "$model"
policy=$out/bench-vllm-gemma3.yaml
write_policy "$model" "$policy" "2:512,512,1024,full" "5:512,2048,full,full"
bench_random_tokens "$out/tokens.json" 16
export OMP_NUM_THREADS=$threads VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-auto}
"$py" "$root/tools/bench_vllm.py" --model "$model" --policy "$policy" --tokens-file "$out/tokens.json" \
  --rounds "$reps" --json-out "$out/bench-vllm.json" 2>"$out/bench-vllm.log"
echo "(details: $out/bench-vllm.json, vLLM's log: $out/bench-vllm.log)"
