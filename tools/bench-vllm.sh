#!/usr/bin/env bash
# vLLM with and without a headwise policy on one model, side by side in one run: prefill and
# decode tokens/s, KV bytes per max-length request and maximum concurrency as vLLM reports them
# (tools/bench_vllm.py; the two engines alternate in one process, --reps rounds of each, three
# measurements per engine and round; rates as median and best).
#
#   tools/bench-vllm.sh [--threads 1] [--reps 2] [--out DIR]
#
# One thread by default: vLLM binds its OpenMP threads, and on this shared 2-core machine two
# threads spin at every op's barrier (measured: 8 requests x 32 decoded tokens took 17.7 s at 2
# threads, 0.95 s at 1, the same run).
#
# The model (made once into models/bench-vllm-gemma3/, random weights, bf16): Gemma-3 layout, 6
# layers (sliding window 512 on 4, global on 2), 8 query / 4 KV heads of 64, hidden 512, vocab
# 4096. The policy (hand-written, not calibrated: this measures serving, not quality): layer 2
# [512, 512, 1024, full], layer 5 [512, 2048, full, full]. vLLM: max_model_len 8192,
# max_num_batched_tokens 512 (a sliding head reserves W - 1 + 512 tokens), bf16, eager, 1 GiB KV
# pool (VLLM_CPU_KVCACHE_SPACE). Prefill: 2 prompts of 4096 tokens; decode: 8 prompts of 256
# tokens, 64 new tokens each.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tools/bench_common.sh
source "$root/tools/bench_common.sh"
threads=1 reps=2 out=/tmp/headwise-bench-vllm
bench_parse_args bench-vllm "$@"
mkdir -p "$out"
"$root/tools/setup.sh" --vllm >/dev/null
py=$root/.venv-vllm/bin/python
model=$root/models/bench-vllm-gemma3
if [[ ! -f $model/config.json ]]; then
  "$py" - "$model" <<'PY'
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
fi
policy=$out/bench-vllm-gemma3.yaml
"$py" - "$model" "$policy" <<'PY'
import hashlib, pathlib, sys
model, policy = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
sha = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()
policy.write_text("\n".join([
    "schema: headwise/policy/v1", 'model_name: "bench-vllm-gemma3"', f'model_path: "{model}"',
    "model_fingerprint:", f"  config_sha256: {sha}", "budget_gb: 0", "context: 8192", "batch: 1",
    "dtype: bfloat16", "block_size: 16", "sink_tokens: 0", "window_levels: [512, 1024, 2048, full]",
    "per_layer_policies:", "  - layer_id: 2", "    kv_head_windows: [512, 512, 1024, full]",
    "  - layer_id: 5", "    kv_head_windows: [512, 2048, full, full]", ""]))
PY
bench_random_tokens "$out/tokens.json" 16
export OMP_NUM_THREADS=$threads VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-auto}
"$py" "$root/tools/bench_vllm.py" --model "$model" --policy "$policy" --tokens-file "$out/tokens.json" \
  --rounds "$reps" --json-out "$out/bench-vllm.json" 2>"$out/bench-vllm.log"
echo "(details: $out/bench-vllm.json, vLLM's log: $out/bench-vllm.log)"
