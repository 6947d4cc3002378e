#!/usr/bin/env python3
"""Builds the shipped default model, models/tiny-qwen3-next: a small Qwen3-Next-layout hybrid
(gated-DeltaNet layers + gated full-attention layers with GQA, MoE with a shared expert).

Random weights from a fixed seed, saved with transformers (pinned in versions.env). It makes
the README's main command runnable anywhere in under a minute; it is not a trained model.
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from fixtures.common import check_versions  # noqa: E402

CONFIG = {
    "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 8,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
    "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1,
    "norm_topk_prob": True, "rms_norm_eps": 1e-6, "max_position_embeddings": 65536, "tie_word_embeddings": False,
}


def main():
    check_versions()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = ROOT / "models" / "tiny-qwen3-next"
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_next", **CONFIG)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "README.md").write_text(
        "# tiny-qwen3-next\n\nRandom-weight Qwen3-Next-layout hybrid (8 layers: 6 gated-DeltaNet, 2 gated full "
        "attention with 8 query / 4 KV heads; MoE with shared expert), bf16, built by tools/make_default_model.py "
        "from seed 0. Not trained: it exercises the pipeline, not quality.\n")
    print(json.dumps({"model": str(out), "params": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
