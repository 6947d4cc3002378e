"""The window layer of HeadwiseCache (cache.py): a global attention layer whose KV heads keep
recency windows, laid out as headwise's runtime grouped cache lays them out
(include/headwise/runtime/grouped_cache.hpp):

    group = the KV heads with one window w; K and V buffers [batch, heads, slots, head_dim]
    slots = round_up(min(w + S, L), block)          (full: round_up(L, block))
    position p < S  -> slot p                        (S sink tokens stay in the first S slots)
    position p >= S -> slot S + (p - S) mod w        (full heads: slot p; never wraps)

where L is the cached length (`preallocate=True`: the policy's context C from the start). At
L = C this is exactly the runtime's layout and memory::global_head_slots; below it the buffers
grow by blocks, and since slot(p) does not depend on L, growing never moves a key.

A layer's `update` does not return all keys: it returns the new keys tagged with a plan, and
the `headwise` attention function (attention.py) attends each group's queries over what the
group holds plus the new keys under the visible-keys rule (include/headwise/arch/visible_keys.hpp),
then writes the new keys into the rings. Attending before writing keeps chunks longer than a ring
exact (runtime/cached_attention.cpp does the same). The kernel is the runtime's default one: torch's
fused attention (scaled_dot_product_attention with a bool mask, `fused_masked_attention`, which is
also what transformers' sdpa attention runs) wherever it applies, the explicit matmul, fp32 softmax,
matmul where the probabilities are needed (h2o heads) or sdpa cannot run them (sink logits,
soft-capping).

_PolicyLayer is what every policy layer shares (the plan, the shapes, transformers' layer API);
selecting_layer.py builds the h2o/snap layer on it.
"""
from __future__ import annotations

from typing import Optional

import torch
from transformers.cache_utils import CacheLayerMixin

from .policy import FULL, Policy, PolicyError, head_slots


class _Group:
    __slots__ = ("window", "heads", "heads_t", "k", "v")

    def __init__(self, window: Optional[int], heads: list[int]):
        self.window = window
        self.heads = heads
        self.heads_t: Optional[torch.Tensor] = None
        self.k: Optional[torch.Tensor] = None  # [B, h, slots, D] in the policy's KV dtype
        self.v: Optional[torch.Tensor] = None

    def ring(self) -> Optional[int]:
        return self.window  # None (full): never wraps


def held_positions(filled: int, sinks: int, ring: Optional[int], device) -> torch.Tensor:
    """Absolute positions in the used slots [0, n) after `filled` positions were written (the
    used slots are always a prefix: sinks fill first, the ring fills in order)."""
    if ring is None:
        return torch.arange(filled, device=device)
    n_sinks = min(filled, sinks)
    n_ring = min(max(filled - sinks, 0), ring)
    s = torch.arange(n_sinks, device=device)
    if n_ring == 0:
        return s
    j = torch.arange(n_ring, device=device)
    latest = sinks + j + ring * torch.div(filled - 1 - sinks - j, ring, rounding_mode="floor")
    return torch.cat([s, latest])


def fused_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                           scaling: float) -> torch.Tensor:
    """softmax(q k^T * scaling, masked to `allowed`) v through torch's fused attention, as headwise's
    runtime decoder attends by default (arch::fused_masked_attention, `--runtime-attention fused`):
    a KV head's query group is one run of group x T rows over its keys, one [T, N] mask for all.
    q [B, h, g, T, D], k/v [B, h, N, D] -> [B, h, g, T, Dv]. This is also the kernel transformers'
    sdpa attention runs; the explicit matmul/softmax/matmul agrees with it only up to the last
    bits, which a state rounded to bf16 after each chunk can turn into a whole bf16 step."""
    bsz, heads, group, steps, dim = q.shape
    rows = q.reshape(bsz, heads, group * steps, dim)
    mask = allowed if group == 1 else allowed.repeat(group, 1)
    out = torch.nn.functional.scaled_dot_product_attention(rows, k, v, attn_mask=mask, dropout_p=0.0,
                                                           is_causal=False, scale=scaling)
    return out.reshape(bsz, heads, group, steps, v.shape[-1])


class _Plan:
    """What the attention function needs for one layer call; commit() writes the new keys."""

    def __init__(self, layer: "HeadwiseLayer", filled: int, new_k: torch.Tensor, new_v: torch.Tensor):
        self.layer, self.filled, self.new_k, self.new_v = layer, filled, new_k, new_v
        self.committed = False

    def commit(self):
        if not self.committed:
            self.committed = True
            self.layer._write(self.filled, self.new_k, self.new_v)


class _PolicyLayer(CacheLayerMixin):
    """What the two kinds of policy layer share: the policy's shape, the cached length, the plan
    handed from `update` to the attention function, and transformers' length queries."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, layer_id: int, windows: list[Optional[int]], policy: Policy, *, preallocate: bool,
                 allow_beyond_context: bool, attn_check):
        super().__init__()
        self.layer_id = layer_id
        self.windows = list(windows)
        self.sinks = policy.sink_tokens
        self.block = policy.block_size
        self.context = policy.context
        self.kv_dtype = policy.kv_dtype
        self.preallocate = preallocate
        self.allow_beyond_context = allow_beyond_context
        self._attn_check = attn_check
        self.cumulative_length = 0
        self.pending: Optional[_Plan] = None
        self.batch_size = None

    def _take_shapes(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The first update's dtype, device, batch and head dims; its KV heads must be the policy's."""
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size = key_states.shape[0]
        self.head_dim, self.value_dim = key_states.shape[-1], value_states.shape[-1]
        if key_states.shape[1] != len(self.windows):
            raise PolicyError(f"layer {self.layer_id}: the model has {key_states.shape[1]} KV heads, the policy "
                              f"gives {len(self.windows)} windows")

    def _unfinished_plan(self) -> None:
        """The last update's attention never ran (should not happen)."""
        raise NotImplementedError

    # --- the CacheLayerMixin interface ---------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self._attn_check()
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.pending is not None:
            self._unfinished_plan()
        if key_states.shape[0] != self.batch_size:
            raise ValueError(f"HeadwiseCache layer {self.layer_id}: batch {key_states.shape[0]}, cache holds "
                             f"{self.batch_size} sequences (use a new cache per batch)")
        filled = self.cumulative_length
        steps = key_states.shape[2]
        if filled + steps > self.context and (self.preallocate or not self.allow_beyond_context):
            raise ValueError(f"HeadwiseCache: {filled + steps} tokens exceed the policy's context of {self.context} "
                             "tokens (the windows were chosen for it); pass allow_beyond_context=True to "
                             "HeadwiseCache.from_policy to run past it")
        self.cumulative_length = filled + steps
        plan = _Plan(self, filled, key_states, value_states)
        self.pending = plan
        # The attention function finds the plan on the tensor it receives as `key`.
        tagged_k = key_states.view_as(key_states)
        tagged_k._headwise_plan = plan
        return tagged_k, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1 if self.allow_beyond_context and not self.preallocate else self.context


class HeadwiseLayer(_PolicyLayer):
    """One global attention layer under a policy: per-window head groups of ring buffers."""

    def __init__(self, layer_id: int, windows: list[Optional[int]], policy: Policy, *, preallocate: bool,
                 allow_beyond_context: bool, attn_check):
        super().__init__(layer_id, windows, policy, preallocate=preallocate,
                         allow_beyond_context=allow_beyond_context, attn_check=attn_check)
        by_window: dict = {}
        for h, w in enumerate(windows):
            by_window.setdefault(w, []).append(h)
        # Ascending windows, full last: the runtime's order.
        order = sorted(by_window, key=lambda w: (w is FULL, w or 0))
        self.groups = [_Group(w, by_window[w]) for w in order]

    def _unfinished_plan(self) -> None:
        self.pending.commit()

    # --- storage -------------------------------------------------------------------------
    def _slots(self, group: _Group, length: int) -> int:
        return head_slots(group.window, self.sinks, length, self.block)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._take_shapes(key_states, value_states)
        length = self.context if self.preallocate else 0
        for g in self.groups:
            g.heads_t = torch.tensor(g.heads, device=self.device, dtype=torch.long)
            slots = self._slots(g, length)
            g.k = torch.zeros(self.batch_size, len(g.heads), slots, self.head_dim, dtype=self.kv_dtype, device=self.device)
            g.v = torch.zeros(self.batch_size, len(g.heads), slots, self.value_dim, dtype=self.kv_dtype, device=self.device)
        # transformers looks at .keys/.values in places (offload, repr): the groups are the storage.
        self.keys = self.values = None
        self.is_initialized = True

    def _grow(self, g: _Group, length: int) -> None:
        slots = self._slots(g, length)
        if slots <= g.k.shape[2]:
            return
        for name in ("k", "v"):
            old = getattr(g, name)
            new = old.new_zeros(old.shape[0], old.shape[1], slots, old.shape[3])
            new[:, :, : old.shape[2]] = old
            setattr(g, name, new)

    def _write(self, filled: int, new_k: torch.Tensor, new_v: torch.Tensor) -> None:
        steps = new_k.shape[2]
        end = filled + steps
        for g in self.groups:
            self._grow(g, end)
            k = new_k.index_select(1, g.heads_t).to(self.kv_dtype)
            v = new_v.index_select(1, g.heads_t).to(self.kv_dtype)
            sink_end = min(end, self.sinks)
            if g.window is FULL:
                g.k[:, :, filled:end] = k
                g.v[:, :, filled:end] = v
                continue
            if filled < sink_end:
                g.k[:, :, filled:sink_end] = k[:, :, : sink_end - filled]
                g.v[:, :, filled:sink_end] = v[:, :, : sink_end - filled]
            # Only the positions the ring keeps are written, once each.
            ring_begin = max(filled, self.sinks, end - g.window)
            if ring_begin >= end:
                continue
            pos = torch.arange(ring_begin, end, device=k.device)
            slots = self.sinks + torch.remainder(pos - self.sinks, g.window)
            g.k.index_copy_(2, slots, k[:, :, ring_begin - filled:])
            g.v.index_copy_(2, slots, v[:, :, ring_begin - filled:])

    def attend(self, plan: _Plan, query: torch.Tensor, scaling: float, softcap: Optional[float] = None,
               s_aux: Optional[torch.Tensor] = None, query_chunk: int = 512) -> torch.Tensor:
        """query [B, H, T, D] at positions filled.. → output [B, T, H, Dv]; then writes the new keys."""
        bsz, num_heads, steps, _ = query.shape
        num_kv = len(self.windows)
        group_size = num_heads // num_kv
        q = query.reshape(bsz, num_kv, group_size, steps, query.shape[-1])
        out = query.new_empty(bsz, num_kv, group_size, steps, plan.new_v.shape[-1])
        dtype = query.dtype
        filled = plan.filled
        q_pos_all = torch.arange(filled, filled + steps, device=query.device)
        for g in self.groups:
            ring = g.ring()
            held_pos = held_positions(filled, self.sinks, ring, query.device)
            used = held_pos.shape[0]
            new_k = plan.new_k.index_select(1, g.heads_t)
            new_v = plan.new_v.index_select(1, g.heads_t)
            # New keys pass through the cache dtype, so every key a query sees went through the
            # same storage whatever the chunking (as the runtime does).
            if self.kv_dtype != dtype:
                new_k, new_v = new_k.to(self.kv_dtype).to(dtype), new_v.to(self.kv_dtype).to(dtype)
            k = torch.cat([g.k[:, :, :used].to(dtype), new_k], dim=2).unsqueeze(2)  # [B, h, 1, N, D]
            v = torch.cat([g.v[:, :, :used].to(dtype), new_v], dim=2).unsqueeze(2)
            k_pos = torch.cat([held_pos, q_pos_all])
            sinks = 0 if g.window is FULL else self.sinks
            qg = q.index_select(1, g.heads_t)
            sink_logit = None
            if s_aux is not None:
                sink_logit = s_aux.reshape(num_kv, group_size).index_select(0, g.heads_t).view(1, -1, group_size, 1, 1)
            og = qg.new_empty(qg.shape[:-1] + (v.shape[-1],))
            for t0 in range(0, steps, query_chunk):
                t1 = min(steps, t0 + query_chunk)
                qp = q_pos_all[t0:t1, None]
                kp = k_pos[None, :]
                allowed = kp <= qp
                if g.window is not FULL:
                    allowed = allowed & ((qp - kp < g.window) | (kp < sinks))
                if sink_logit is None and not softcap:
                    og[:, :, :, t0:t1] = fused_masked_attention(qg[:, :, :, t0:t1], k.squeeze(2), v.squeeze(2),
                                                                allowed, scaling)
                    continue
                scores = torch.matmul(qg[:, :, :, t0:t1], k.transpose(-1, -2)) * scaling  # [B, h, g, tc, N]
                if softcap:
                    scores = torch.tanh(scores / softcap) * softcap
                logits = scores.float().masked_fill(~allowed, float("-inf"))
                if sink_logit is None:
                    probs = torch.softmax(logits, dim=-1)
                else:
                    sl = sink_logit.float().expand(*logits.shape[:-1], 1)
                    probs = torch.softmax(torch.cat([logits, sl], dim=-1), dim=-1)[..., :-1]
                og[:, :, :, t0:t1] = torch.matmul(probs.to(v.dtype), v)
            out.index_copy_(1, g.heads_t, og)
        plan.commit()
        if self.pending is plan:
            self.pending = None
        return out.reshape(bsz, num_heads, steps, -1).transpose(1, 2).contiguous()

    def kv_bytes(self) -> int:
        """Bytes of this layer's K and V buffers (storage sizes)."""
        total = 0
        for g in self.groups:
            for t in (g.k, g.v):
                if t is not None:
                    total += t.untyped_storage().nbytes()
        return total

    def reset(self) -> None:
        for g in self.groups:
            if g.k is not None:
                g.k.zero_()
                g.v.zero_()
        self.cumulative_length = 0
        self.pending = None

    def offload(self):
        for g in self.groups:
            if g.k is not None:
                g.k, g.v = g.k.to("cpu", non_blocking=True), g.v.to("cpu", non_blocking=True)

    def prefetch(self):
        for g in self.groups:
            if g.k is not None and g.k.device != self.device:
                g.k, g.v = g.k.to(self.device, non_blocking=True), g.v.to(self.device, non_blocking=True)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for g in self.groups:
            if g.k is not None:
                g.k = g.k.index_select(0, beam_idx.to(g.k.device))
                g.v = g.v.index_select(0, beam_idx.to(g.v.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        for g in self.groups:
            if g.k is not None:
                g.k, g.v = g.k.repeat_interleave(repeats, dim=0), g.v.repeat_interleave(repeats, dim=0)
        if self.batch_size is not None:
            self.batch_size *= repeats

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for g in self.groups:
            if g.k is not None:
                g.k, g.v = g.k[indices, ...], g.v[indices, ...]
        if self.batch_size is not None and len(self.groups) and self.groups[0].k is not None:
            self.batch_size = self.groups[0].k.shape[0]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("HeadwiseCache: a ring overwrites what it drops, so it cannot be cropped")

    def __repr__(self):
        ws = ",".join("full" if w is FULL else str(w) for w in self.windows)
        return f"HeadwiseLayer(layer={self.layer_id}, windows=[{ws}], sinks={self.sinks})"
