#!/usr/bin/env python3
"""Bytes vLLM's own allocator code reserves for one request, for mem-estimate's tests.

Imports vllm.v1.kv_cache_interface and vllm.v1.core.kv_cache_utils from a vLLM tree on
PYTHONPATH (an unpacked wheel of the release pinned as VLLM_RULES_VERSION in versions.env is
enough: nothing is installed) and prints one JSON object per case on stdout:
  {"name", "total_bytes", "per_spec": [max_memory_usage_bytes of each spec]}
Exit 3 when vLLM cannot be imported (the C++ test then skips).

Each case is given as JSON on stdin: {"name", "max_model_len", "max_num_batched_tokens",
"mamba_cache_mode", "specs": [{"kind": "full"|"sliding"|"mamba", "block_size", "num_kv_heads",
"head_size", "window", "shapes", "dtypes", "page_size_padded"}]}; dtypes are "bfloat16"/"float32"...
"""
import json
import sys
from types import SimpleNamespace

try:
    import torch
    from vllm.v1 import kv_cache_interface as kci
    from vllm.v1.core import kv_cache_utils as kcu
except Exception as e:  # noqa: BLE001 - any import failure means "no vLLM here"
    print(f"vLLM not importable: {e}", file=sys.stderr)
    sys.exit(3)


def make_spec(s):
    dtype = getattr(torch, s.get("dtype", "bfloat16"))
    if s["kind"] == "full":
        return kci.FullAttentionSpec(block_size=s["block_size"], num_kv_heads=s["num_kv_heads"],
                                     head_size=s["head_size"], dtype=dtype)
    if s["kind"] == "sliding":
        return kci.SlidingWindowSpec(block_size=s["block_size"], num_kv_heads=s["num_kv_heads"],
                                     head_size=s["head_size"], dtype=dtype, sliding_window=s["window"])
    return kci.MambaSpec(block_size=s["block_size"], shapes=tuple(tuple(x) for x in s["shapes"]),
                         dtypes=tuple(getattr(torch, d) for d in s["dtypes"]),
                         page_size_padded=s.get("page_size_padded"),
                         mamba_cache_mode=s.get("mamba_cache_mode", "none"))


def config(case):
    # Only the fields the spec classes and the grouping read.
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=case["max_model_len"]),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=case["max_num_batched_tokens"],
                                         disable_hybrid_kv_cache_manager=False),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
        cache_config=SimpleNamespace(mamba_cache_mode=case.get("mamba_cache_mode", "none")),
        speculative_config=None, kv_transfer_config=None)


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        cfg = config(case)
        specs = {f"layer.{i}": make_spec(s) for i, s in enumerate(case["specs"])}
        per_spec = [spec.max_memory_usage_bytes(cfg) for spec in specs.values()]
        groups = kcu.get_kv_cache_groups(cfg, dict(specs))
        total = kcu._max_memory_usage_bytes_from_groups(cfg, groups)
        print(json.dumps({"name": case["name"], "total_bytes": total, "per_spec": per_spec,
                          "groups": [len(g.layer_names) for g in groups]}))


if __name__ == "__main__":
    main()
