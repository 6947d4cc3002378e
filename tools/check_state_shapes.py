#!/usr/bin/env python3
"""Prints the decode-state shapes and dtypes the reference HF caches really hold.

For every config-level family headwise models (and the ones with forwards), builds a tiny
random model from a tiny config of that family (below), runs a prefill
longer than any sliding window plus two decode steps in bfloat16 on the torch path, and prints
for each layer the cache class, the key/value shapes and every conv/recurrent state with its
dtype. tests/arch/state_shapes_test.cpp encodes these facts; rerun this script when pinning a
new transformers version and compare.

Usage: python tools/check_state_shapes.py [--json] [family ...]
"""
import argparse
import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

TINY = {
    "bamba": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "attn_layer_indices": [1, 3], "num_attention_heads": 4, "num_key_value_heads": 2,
              "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16,
              "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 8},
    "granitemoehybrid": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 32,
                         "shared_intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
                         "num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"],
                         "num_attention_heads": 4, "num_key_value_heads": 2, "position_embedding_type": "nope",
                         "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_d_state": 16,
                         "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 8},
    "nemotron_h": {"vocab_size": 128, "hidden_size": 64, "hybrid_override_pattern": "M-M*E",
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                   "mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 2, "ssm_state_size": 16,
                   "conv_kernel": 4, "chunk_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32, "n_group": 1,
                   "topk_group": 1, "use_mamba_kernels": False},
    "gpt_oss": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 4},
    "lfm2": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 192, "block_multiple_of": 32,
             "num_hidden_layers": 4, "layer_types": ["conv", "conv", "full_attention", "conv"],
             "num_attention_heads": 4, "num_key_value_heads": 2, "conv_L_cache": 3},
    "jamba": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "attn_layer_period": 4, "attn_layer_offset": 2, "expert_layer_period": 2, "expert_layer_offset": 1,
              "num_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "mamba_d_state": 8, "mamba_dt_rank": 4, "use_mamba_kernels": False},
    "falcon_h1": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "mamba_n_heads": 4,
                  "mamba_d_head": 16, "mamba_d_ssm": 64, "mamba_n_groups": 2, "mamba_d_state": 8,
                  "mamba_d_conv": 4, "mamba_chunk_size": 8},
    "qwen3_next": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                   "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                   "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                   "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_experts": 4,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
                   "decoder_sparse_step": 1},
    "gemma3_text": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "query_pre_attn_scalar": 16, "sliding_window": 4},
}

PREFILL = 11  # longer than every sliding window and conv kernel above
DECODE_STEPS = 2


def describe(t):
    return None if t is None else {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}


def inspect_family(name):
    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **TINY[name])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.bfloat16).eval()
    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, 128, (2, PREFILL))
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True)
        for _ in range(DECODE_STEPS):
            out = model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
    cache = out.past_key_values
    layers = []
    for i, layer in enumerate(cache.layers):
        entry = {"layer": i, "class": type(layer).__name__}
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel() > 0:
            entry["keys"] = describe(keys)
            entry["values"] = describe(layer.values)
        for kind in ("conv_states", "recurrent_states"):
            states = getattr(layer, kind, None) or {}
            for idx, t in states.items():
                if t is not None:
                    entry[f"{kind}[{idx}]"] = describe(t)
        layers.append(entry)
    return {"family": name, "transformers": transformers.__version__, "batch": 2,
            "tokens_seen": PREFILL + DECODE_STEPS, "layers": layers}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", default=list(TINY))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for name in args.families:
        try:
            results.append(inspect_family(name))
        except Exception as e:  # report and continue: one broken family should not hide the others
            results.append({"family": name, "error": f"{type(e).__name__}: {e}"})
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        return
    for r in results:
        print(f"== {r['family']}")
        if "error" in r:
            print("   ERROR", r["error"])
            continue
        for entry in r["layers"]:
            parts = [f"{k}={v['shape']}:{v['dtype']}" for k, v in entry.items() if isinstance(v, dict)]
            print(f"   layer {entry['layer']} {entry['class']}: " + " ".join(parts))


if __name__ == "__main__":
    main()
