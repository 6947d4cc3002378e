"""What vLLM must build for a policy: pure functions, no vLLM import (tested on their own).

For each global attention layer the policy names, the KV heads are grouped by window (ascending,
`full` last: the order of headwise's runtime grouped cache and of HeadwiseCache) and permuted so
each group is contiguous. Each group becomes one vLLM attention layer over its slice of heads,
with `sliding_window = W` (None for `full`), so vLLM's hybrid KV cache manager gives it its own
block table and frees what leaves its window, exactly as it does for a model's own sliding layers.

Under tensor parallelism each rank holds a contiguous shard of a layer's KV heads (vLLM's
QKVParallelLinear: rank r holds heads [r*k, (r+1)*k), k = heads / ranks), or one replicated head
when the layer has fewer KV heads than ranks (rank r holds head r // (ranks / heads)). vLLM builds
one KV cache layout (the same attention layers, specs and layer names) for every rank, so a policy
serves at a tensor-parallel size only when every rank's shard holds the same multiset of windows
(shard_windows, check_shards); each rank then groups and permutes its own shard's heads
(plan_model's tp_rank), and the groups are the same on every rank. Pipeline parallelism splits the
layers and changes nothing per head.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from headwise_hf.policy import FULL, Policy, PolicyError, config_sha256

# Families the plugin serves (HF model_type of the text config). The layer kinds come from
# layer_types (absent: every layer global); in the gated-DeltaNet hybrids (qwen3_next, qwen3_5*)
# only the full_attention layers have a KV cache, the linear_attention layers keep their states.
SERVED_MODEL_TYPES = ("gemma3_text", "qwen3", "llama", "gpt_oss", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

ENV_POLICY = "HEADWISE_POLICY"


@dataclasses.dataclass(frozen=True)
class HeadGroup:
    """KV heads [first, first + count) of the permuted layer, all keeping `window` tokens."""
    first: int
    count: int
    window: Optional[int]  # None: full

    @property
    def name(self) -> str:
        # A layer-name suffix without a bare integer: vLLM reads the layer index as the only
        # all-digit component of a layer name (extract_layer_index).
        return "headwise_full" if self.window is FULL else f"headwise_w{self.window}"


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    layer_id: int
    windows: tuple  # the policy's windows, checkpoint head order
    permutation: tuple  # new KV head j is checkpoint KV head permutation[j]
    groups: tuple  # HeadGroup, in permuted order

    @property
    def split(self) -> bool:
        """More than one window: the layer becomes one attention layer per group."""
        return len(self.groups) > 1

    def query_permutation(self, num_heads: int) -> list[int]:
        """New query head i is checkpoint query head result[i] (each KV head's GQA group follows it)."""
        kv = len(self.windows)
        if num_heads % kv:
            raise PolicyError(f"layer {self.layer_id}: {num_heads} query heads do not split over {kv} KV heads")
        per = num_heads // kv
        return [h * per + j for h in self.permutation for j in range(per)]


def plan_layer(layer_id: int, windows: list) -> LayerPlan:
    by_window: dict = {}
    for head, w in enumerate(windows):
        by_window.setdefault(w, []).append(head)
    order = sorted(by_window, key=lambda w: (w is FULL, w or 0))
    permutation, groups = [], []
    for w in order:
        groups.append(HeadGroup(first=len(permutation), count=len(by_window[w]), window=w))
        permutation.extend(by_window[w])
    return LayerPlan(layer_id=layer_id, windows=tuple(windows), permutation=tuple(permutation), groups=tuple(groups))


def shard_heads(num_kv_heads: int, tp_size: int) -> list[list[int]]:
    """The checkpoint KV heads each tensor-parallel rank holds, as vLLM's QKVParallelLinear shards
    them: contiguous shards of num_kv_heads / tp_size heads, or (fewer heads than ranks) one
    replicated head per rank, rank r holding head r // (tp_size / num_kv_heads)."""
    if num_kv_heads >= tp_size:
        if num_kv_heads % tp_size:
            raise ValueError(f"{num_kv_heads} KV heads do not split over {tp_size} ranks")
        per = num_kv_heads // tp_size
        return [list(range(r * per, (r + 1) * per)) for r in range(tp_size)]
    if tp_size % num_kv_heads:
        raise ValueError(f"{tp_size} ranks do not replicate {num_kv_heads} KV heads evenly")
    replicas = tp_size // num_kv_heads
    return [[r // replicas] for r in range(tp_size)]


def shard_windows(windows: list, tp_size: int) -> list[list]:
    """Each rank's windows (checkpoint head order within its shard)."""
    return [[windows[h] for h in heads] for heads in shard_heads(len(windows), tp_size)]


def _window_key(w):
    return (w is FULL, w or 0)


def _shard_text(shard: list) -> str:
    return "[" + ", ".join("full" if w is FULL else str(w) for w in shard) + "]"


def shard_mismatch(windows: list, tp_size: int) -> Optional[str]:
    """None when every rank's shard holds the same multiset of windows at tp_size; otherwise what
    differs (for the refusal's line)."""
    shards = shard_windows(windows, tp_size)
    first = sorted(shards[0], key=_window_key)
    for r, shard in enumerate(shards[1:], start=1):
        if sorted(shard, key=_window_key) != first:
            return f"rank 0 holds windows {_shard_text(shards[0])}, rank {r} {_shard_text(shard)}"
    return None


def check_shards(policy: Policy, tp_size: int, num_heads: Optional[int] = None) -> None:
    """Refuses a policy whose layers do not shard evenly at tensor_parallel_size tp_size: every
    rank's shard of every global layer must hold the same windows (vLLM builds one KV cache layout
    for all ranks). A policy calibrated for another size serves where its shards also match (a
    tp=2 policy at tp=1: one rank holds every shard)."""
    if tp_size < 1:
        raise PolicyError(f"tensor_parallel_size must be positive, got {tp_size}")
    if tp_size == 1:
        return
    recorded = getattr(policy, "tensor_parallel_size", None)
    made = (f" (the policy was calibrated for tensor_parallel_size {recorded})" if recorded and recorded != tp_size
            else "")
    if num_heads is not None and num_heads % tp_size:
        raise PolicyError(f"{policy.path}: the model's {num_heads} query heads do not split over "
                          f"tensor_parallel_size {tp_size}")
    for layer_id, windows in sorted(policy.windows.items()):
        kv = len(windows)
        try:
            why = shard_mismatch(windows, tp_size)
        except ValueError as e:
            raise PolicyError(f"{policy.path}: layer {layer_id}: {e} (tensor_parallel_size {tp_size})") from None
        if why:
            raise PolicyError(f"{policy.path}: per_layer_policies layer {layer_id}: kv_head_windows "
                              f"{_shard_text(windows)} do not shard over tensor_parallel_size {tp_size}: {why}; "
                              f"vLLM builds one KV cache layout for every rank, so every rank's shard ({kv // tp_size or 1} "
                              f"of {kv} KV heads) must hold the same windows{made}: calibrate with "
                              f"--tensor-parallel-size {tp_size}")


def layer_kinds(text_config) -> list[str]:
    n = text_config.num_hidden_layers
    kinds = list(getattr(text_config, "layer_types", None) or ["full_attention"] * n)
    if len(kinds) != n:
        raise PolicyError(f"the model's layer_types lists {len(kinds)} layers, num_hidden_layers is {n}")
    return kinds


def check_servable(policy: Policy) -> None:
    """What the policy asks that no vLLM attention layer can do: refused before the model loads."""
    # Why vLLM cannot serve each selecting rule, and where such a policy runs instead.
    unservable = (
        ("snap", policy.snap_heads(), "vLLM cannot compact a request's pages after prefill, so it cannot serve "
         "them: headwise's runtime, HeadwiseCache or HeadwisePress can (docs/keep-rules.md)"),
        ("h2o", policy.h2o_heads(), "vLLM keeps a window per layer and selects no tokens, so it cannot serve them: "
         "calibrate with --keep-rules window for a policy vLLM can serve (docs/deploy.md says where an h2o "
         "policy runs)"),
    )
    for rule, heads, why in unservable:
        if heads:
            where = ", ".join(f"layer {l} heads {h}" for l, h in heads.items())
            raise PolicyError(f"{policy.path}: kv_head_rules has {rule} heads ({where}); {why}")
    if policy.sink_tokens:
        raise PolicyError(f"{policy.path}: sink_tokens: {policy.sink_tokens}; vLLM's sliding-window attention keeps no "
                          "sink tokens, so the windowed heads would lose them: calibrate with --sink-tokens 0 to serve "
                          "this model in vLLM")


def plan_model(policy: Policy, text_config, model_dir: Optional[str], tp_size: int = 1,
               tp_rank: int = 0) -> dict[int, LayerPlan]:
    """Checks the policy against the model vLLM is loading and plans every global layer: for
    tensor-parallel rank tp_rank of tp_size, the layer's shard of KV heads (shard_heads) as that
    rank holds them, grouped and permuted within the shard."""
    check_servable(policy)
    model_type = getattr(text_config, "model_type", "")
    if model_type not in SERVED_MODEL_TYPES:
        raise PolicyError(f"{policy.path}: model_type {model_type!r} is not a family headwise_vllm serves "
                          f"({', '.join(SERVED_MODEL_TYPES)})")
    if model_dir and policy.config_sha256:
        actual = config_sha256(model_dir)
        if actual is not None and actual != policy.config_sha256:
            raise PolicyError(f"{policy.path}: model_fingerprint.config_sha256 does not match "
                              f"{os.path.join(model_dir, 'config.json')} (a policy for another model)")
    kinds = layer_kinds(text_config)
    globals_ = [i for i, k in enumerate(kinds) if k == "full_attention"]
    if sorted(policy.windows) != globals_:
        raise PolicyError(f"{policy.path}: per_layer_policies names layers {sorted(policy.windows)}, the model's "
                          f"global attention layers are {globals_} (a policy for another model?)")
    num_kv = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    plans = {}
    for layer_id, windows in sorted(policy.windows.items()):
        if len(windows) != num_kv:
            raise PolicyError(f"{policy.path}: layer {layer_id}: {len(windows)} kv_head_windows for {num_kv} KV heads")
    check_shards(policy, tp_size, text_config.num_attention_heads)
    for layer_id, windows in sorted(policy.windows.items()):
        plans[layer_id] = plan_layer(layer_id, shard_windows(windows, tp_size)[tp_rank])
    return plans
