#!/usr/bin/env python3
"""A random-weight checkpoint with a production model's real per-layer dimensions (issue 13).

    tools/make_scale_model.py --config tests/configs/qwen3_next_80b_a3b.json --layers 8 OUT_DIR

Writes OUT_DIR/config.json (the given config cut to --layers layers, same layer pattern) and one
bf16 safetensors shard per decoder layer plus one for the embeddings, head and final norm, with a
model.safetensors.index.json, as Hugging Face ships large checkpoints. At --layers 8 the
Qwen3-Next-80B-A3B layout is about 27 GB: larger than this machine's 24 GiB of RAM.

Nothing the size of the checkpoint is ever in memory: each shard is generated, written and freed
before the next (peak about one MoE layer, 3.2 GB). Tensor names and shapes come from
transformers' own model class instantiated on the meta device; values follow transformers'
initialisation, read off a tiny instance of the same class (tensors it fills with a constant get
that constant, A_log gets log(U(1, 16)) as in the class, everything else N(0, initializer_range)).
Every tensor's values depend only on (--seed, its name): reruns give the same bytes.
"""
import argparse
import hashlib
import json
import pathlib
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))


def layer_types_for(config, layers):
    if "layer_types" in config:
        return config["layer_types"][:layers]
    interval = config.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def cut_config(config, layers):
    out = dict(config)
    out["num_hidden_layers"] = layers
    out["layer_types"] = layer_types_for(config, layers)
    if "full_attention" not in out["layer_types"]:
        raise SystemExit(f"--layers {layers}: no full-attention layer among the first {layers}; calibration needs one")
    out["torch_dtype"] = "bfloat16"
    return out


def pattern_of(name):
    """The tensor's name with layer and expert numbers removed, so a tiny model's tensor names it."""
    return re.sub(r"\.experts\.\d+\.", ".experts.E.", re.sub(r"\.layers\.\d+\.", ".layers.L.", name))


def hf_config_of(config):
    from transformers import AutoConfig

    return AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})


def init_rules(config):
    """pattern (and layer type) -> constant value, or None for random: read off a tiny instance."""
    import torch
    from transformers import AutoModelForCausalLM

    tiny = dict(config)
    tiny.update(hidden_size=64, intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                num_experts=min(config.get("num_experts", 0), 4), num_experts_per_tok=min(config.get("num_experts_per_tok", 0), 2),
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=128,
                num_hidden_layers=len(config["layer_types"]), layer_types=config["layer_types"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config_of(tiny), dtype=torch.float32)
    rules = {}
    for name, t in model.state_dict().items():
        flat = t.flatten()
        rules[pattern_of(name)] = float(flat[0]) if bool((flat == flat[0]).all()) else None
    return rules


def tensor_values(name, shape, rule, std, seed):
    import torch

    if rule is not None:
        return torch.full(shape, rule, dtype=torch.bfloat16)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1, 16, generator=gen).log().to(torch.bfloat16)
    return (torch.randn(shape, generator=gen) * std).to(torch.bfloat16)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a production config.json (e.g. tests/configs/qwen3_next_80b_a3b.json)")
    p.add_argument("--layers", type=int, required=True, help="decoder layers to keep (the first N)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("out", type=pathlib.Path)
    args = p.parse_args()
    if args.layers < 1:
        raise SystemExit("--layers: must be at least 1")

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    config = cut_config(json.loads(pathlib.Path(args.config).read_text()), args.layers)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(hf_config_of(config))
    shapes = {name: tuple(t.shape) for name, t in meta.state_dict().items()}
    rules = init_rules(config)
    std = config.get("initializer_range", 0.02)

    shards = {}
    for name in shapes:
        m = re.search(r"\.layers\.(\d+)\.", name)
        shards.setdefault(f"layer-{int(m.group(1)):05d}" if m else "head", []).append(name)

    args.out.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    start = time.time()
    for i, (shard, names) in enumerate(sorted(shards.items())):
        file = f"model-{shard}.safetensors"
        tensors = {n: tensor_values(n, shapes[n], rules[pattern_of(n)], std, args.seed) for n in names}
        tmp = args.out / (file + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.rename(args.out / file)
        size = sum(t.numel() * 2 for t in tensors.values())
        total += size
        weight_map.update({n: file for n in names})
        del tensors
        print(f"[{i + 1}/{len(shards)}] {file}: {size / 1e9:.2f} GB ({time.time() - start:.0f} s)", file=sys.stderr)
    (args.out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=1))
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(json.dumps({"model": str(args.out), "bytes": total, "layers": args.layers,
                      "layer_types": config["layer_types"]}))


if __name__ == "__main__":
    main()
