#!/usr/bin/env python3
"""Builds the synthetic checkpoints tools/bench-calib measures: random-weight Qwen3-Next-layout
hybrids (3 gated-DeltaNet layers per gated full-attention layer, GQA, MoE with a shared
expert), bf16, saved with transformers from a fixed seed. Untrained: they exercise speed and
memory, not quality.

  tools/make_bench_model.py quick OUT_DIR   # ~20 MB: for --quick (under a minute on 2 cores)
  tools/make_bench_model.py full OUT_DIR    # ~450 MB: large enough that streaming matters
  tools/make_bench_model.py depth OUT_DIR --layers N --layout qwen3-next|gemma3
      # tiny dims (hidden 128, 2 KV heads), any depth: how calibration's cost grows with layers.
      # qwen3-next: 3 gated-DeltaNet : 1 gated attention, dense MLP; gemma3: 5 sliding
      # (512-token window) : 1 global, as Gemma-3's layer_types.

The output folder is written only if config.json is missing there (delete it to rebuild).
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from fixtures.common import check_versions  # noqa: E402

BASE = {
    "partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "linear_conv_kernel_dim": 4,
    "decoder_sparse_step": 1, "norm_topk_prob": True, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144, "tie_word_embeddings": False,
}

SIZES = {
    # head_dim 64 and 2 KV heads: the one-pass attention and its Gram-matrix error both apply.
    "quick": {
        "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256,
    },
    # ~225M parameters: per layer ~8M of attention/DeltaNet projections and ~16M of experts.
    "full": {
        "vocab_size": 16384, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 8,
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
        "linear_num_key_heads": 8, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 1024,
    },
}


# The depth sweep's layer: the default model's widths (hidden 128), 2 KV heads.
DEPTH = {
    "qwen3-next": {
        "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 32, "linear_value_head_dim": 32, "num_experts": 0, "num_experts_per_tok": 1,
        "moe_intermediate_size": 384, "shared_expert_intermediate_size": 384, "mlp_only_layers": [],
    },
    "gemma3": {
        "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 512, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 32, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
}


def depth_config(layout, layers):
    if layout == "qwen3-next":
        if layers % 4:
            raise SystemExit("make_bench_model: --layers must be a multiple of 4 for the qwen3-next layout")
        config = dict(BASE, **DEPTH[layout], num_hidden_layers=layers)
        config["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)
        return "qwen3_next", config
    if layers % 6:
        raise SystemExit("make_bench_model: --layers must be a multiple of 6 for the gemma3 layout")
    config = dict(DEPTH[layout], num_hidden_layers=layers)
    config["layer_types"] = (["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6)
    return "gemma3_text", config


def parse_depth_args(args):
    layers, layout = None, "qwen3-next"
    while args:
        flag = args.pop(0)
        if flag not in ("--layers", "--layout") or not args:
            raise SystemExit(f"make_bench_model: unknown or incomplete argument {flag}")
        value = args.pop(0)
        if flag == "--layers":
            layers = int(value)
        elif value in DEPTH:
            layout = value
        else:
            raise SystemExit(f"make_bench_model: --layout must be one of {', '.join(DEPTH)}, got {value}")
    if not layers or layers <= 0:
        raise SystemExit("make_bench_model: depth needs --layers N (N > 0)")
    return depth_config(layout, layers)


def main():
    usage = f"usage: {sys.argv[0]} {{{','.join(SIZES)}}} OUT_DIR | depth OUT_DIR --layers N [--layout qwen3-next|gemma3]"
    if len(sys.argv) < 3 or (sys.argv[1] not in SIZES and sys.argv[1] != "depth"):
        raise SystemExit(usage)
    size, out = sys.argv[1], pathlib.Path(sys.argv[2])
    if size == "depth":
        model_type, config = parse_depth_args(sys.argv[3:])
    elif len(sys.argv) != 3:
        raise SystemExit(usage)
    else:
        model_type, config = "qwen3_next", dict(BASE, **SIZES[size])
        layers = config["num_hidden_layers"]
        config["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)
    if (out / "config.json").exists():
        return
    check_versions()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config), dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    (out / "README.md").write_text(f"# bench-{size}\n\nRandom-weight Qwen3-Next-layout hybrid, {params} parameters, "
                                   "bf16, built by tools/make_bench_model.py from seed 0. For benchmarks only.\n")
    print(json.dumps({"model": str(out), "params": params}))


if __name__ == "__main__":
    main()
