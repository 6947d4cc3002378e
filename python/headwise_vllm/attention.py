"""One global layer as several vLLM attention layers, one per window group of KV heads.

The model code calls `self.attn(q, k, v)` on the whole layer; HeadwiseSplitAttention slices the
heads of each group (contiguous after the load-time permutation, see permute_layer_weights) and
calls that group's own vLLM `Attention`, whose `sliding_window` is the group's window. Each of
those registers under its own layer name (`<layer>.attn.headwise_w<W>` / `.headwise_full`), so
vLLM derives one KV cache spec per group and its hybrid allocator gives each group pages for its
window only.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import vllm_internals
from .plan import LayerPlan


class HeadwiseSplitAttention(nn.Module):
    def __init__(self, attention_cls, plan: LayerPlan, *, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: int, prefix: str, sinks: Optional[torch.Tensor], head_size_v: Optional[int],
                 **kwargs):
        super().__init__()
        self.plan = plan
        self.layer_name = prefix
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_size = head_size
        self.head_size_v = head_size if head_size_v is None else head_size_v
        self.queries_per_kv = num_heads // num_kv_heads
        self.group_names = []
        self.sinks = sinks  # the layer's learned sink logits (gpt-oss), sliced per group after loading
        for g in plan.groups:
            extra = dict(kwargs)
            if sinks is not None:
                # A view of the layer's parameter: permuted in place after loading (rebind_sinks).
                extra["sinks"] = sinks[g.first * self.queries_per_kv:(g.first + g.count) * self.queries_per_kv]
            if head_size_v is not None:
                extra["head_size_v"] = head_size_v
            attn = attention_cls(g.count * self.queries_per_kv, head_size, scale, num_kv_heads=g.count,
                                 per_layer_sliding_window=g.window, prefix=f"{prefix}.{g.name}", **extra)
            self.add_module(g.name, attn)
            self.group_names.append(g.name)

    def groups(self):
        return [(g, getattr(self, name)) for g, name in zip(self.plan.groups, self.group_names)]

    def rebind_sinks(self, sinks: torch.Tensor) -> None:
        """After the permutation: each group's backend reads its slice of the permuted sink logits."""
        for g, attn in self.groups():
            vllm_internals.rebind_backend_sinks(
                attn, sinks[g.first * self.queries_per_kv:(g.first + g.count) * self.queries_per_kv])

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs) -> torch.Tensor:
        # query [T, H*D], key [T, KV*D], value [T, KV*Dv] -> [T, H*Dv]
        tokens = query.shape[0]
        q = query.view(tokens, self.num_heads, self.head_size)
        k = key.view(tokens, self.num_kv_heads, self.head_size)
        v = value.view(tokens, self.num_kv_heads, self.head_size_v)
        outputs = []
        for g, attn in self.groups():
            a, b = g.first, g.first + g.count
            qa, qb = a * self.queries_per_kv, b * self.queries_per_kv
            outputs.append(attn(q[:, qa:qb].reshape(tokens, -1), k[:, a:b].reshape(tokens, -1),
                                v[:, a:b].reshape(tokens, -1), **kwargs))
        return torch.cat(outputs, dim=-1)


def query_rows_per_head(parent: nn.Module, head_size: int) -> int:
    """Rows of qkv_proj's query part per query head. Qwen3-Next/Qwen3.5's gated attention
    (attn_output_gate) stores each head's query and output gate together, [q_h; gate_h], so a
    head's rows move as one block of 2 x head_size and the gate follows its head."""
    return 2 * head_size if getattr(parent, "attn_output_gate", False) else head_size


def permute_layer_weights(parent: nn.Module, split: HeadwiseSplitAttention) -> None:
    """Reorders the checkpoint's heads so each window group is contiguous: q/k/v rows of the fused
    qkv_proj (weight and bias; a gated query's gate rows with it), o_proj's input columns, and the
    sink logits. The model computes the same function; only the head order changes."""
    plan = split.plan
    H, KV = split.num_heads, split.num_kv_heads
    D, Dv = split.head_size, split.head_size_v
    Dq = query_rows_per_head(parent, D)
    kv_perm = torch.tensor(plan.permutation, dtype=torch.long)
    q_perm = torch.tensor(plan.query_permutation(H), dtype=torch.long)

    def rows(heads: torch.Tensor, width: int, offset: int) -> torch.Tensor:
        return offset + (heads[:, None] * width + torch.arange(width)).reshape(-1)

    qkv_rows = torch.cat([rows(q_perm, Dq, 0), rows(kv_perm, D, H * Dq), rows(kv_perm, Dv, H * Dq + KV * D)])
    qkv, o_proj = parent.qkv_proj, parent.o_proj
    with torch.no_grad():
        for name in ("weight", "bias"):
            t = getattr(qkv, name, None)
            if t is not None:
                idx = qkv_rows.to(t.device)
                t.data.copy_(t.data.index_select(0, idx))
        cols = rows(q_perm, Dv, 0).to(o_proj.weight.device)
        o_proj.weight.data.copy_(o_proj.weight.data.index_select(1, cols))
        sinks = getattr(parent, "sinks", None)
        if sinks is not None:
            sinks.data.copy_(sinks.data.index_select(0, q_perm.to(sinks.device)))
            split.rebind_sinks(sinks.data)
