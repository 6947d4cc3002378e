"""HeadwiseCache: a transformers cache that applies a headwise policy physically.

Each global attention layer named by the policy keeps its KV heads in per-window groups, as
headwise's runtime grouped cache does (include/headwise/runtime/grouped_cache.hpp):

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
soft-capping). Other layers are transformers' own, except that
linear-attention/conv layers keep their states in the policy's `state_dtype` (the runtime decoder's
rule: a state is stored, so rounded, at the end of every forward call and read back from there).

A layer whose policy entry lists an h2o head (kv_head_rules) is served as headwise's runtime
serves it, from its eviction cache (runtime/eviction_cache.hpp, EvictionMethod::kH2O with the
layer's window heads): every head owns exactly its slots, round_up(min(w + S, C), block); an h2o
head keeps, whenever its tokens overflow them, the slots/2 most recent tokens plus the highest
accumulated attention among the rest (summed over the queries so far and the head's query heads;
ties keep the more recent), evicting after every chunk and decode step; a window head of that layer
keeps its sinks and most recent tokens and shows its queries exactly its window. Per slot it keeps
a position (int64) and a score (float32): selection_bytes(), equal to mem-estimate's
selection_state_bytes.

A snap head (kv_head_rules `snap`, docs/keep-rules.md) joins such a layer as the runtime serves it
(runtime/snap_attention.cpp): during the prompt it attends to every prompt key (as full KV) and
stages the prompt's K/V in the KV dtype with a float32 score per key, which the observation window's
queries (the prompt's last 32) accumulate chunk by chunk; at the prompt's end it keeps the window
and the prefix keys with the highest max-pooled score (selection.py), and while decoding rotates the
window and the new tokens in a ring after the selected keys. The prompt is the first forward call
unless HeadwiseCache.set_prompt_length says how long it is (a chunked prefill; prompt.py: generate's
chunked prefill tells it, an untold chunk after the first is refused). staged_bytes() and
peak_bytes() measure the staging as mem-estimate's prefill figures count it.
"""
from __future__ import annotations

import json
import os
import warnings
from typing import Optional

import torch
from transformers import DynamicCache
from transformers import cache_utils
from transformers.cache_utils import CacheLayerMixin

# transformers before 5.3 (kvpress's pin) has no linear-attention layers: nothing to keep states of.
LinearAttentionCacheLayerMixin = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())

from .policy import FULL, H2O, SNAP, WINDOW, Policy, PolicyError, config_sha256, head_slots, read_policy
from .prompt import PromptState, follow_generate
from .selection import attention_probs, keep_indices, ring_insert, snap_choice


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


def _round_states_into(layer) -> None:
    """Reallocates `layer`'s freshly initialised state buffers in its headwise state dtypes."""
    for states, dtype in ((layer.conv_states, layer._headwise_conv_dtype),
                          (layer.recurrent_states, layer._headwise_recurrent_dtype)):
        for i, t in states.items():
            if t is not None and dtype is not None and t.dtype != dtype:
                states[i] = t.to(dtype)


_STATE_LAYER_CLASSES: dict = {}


def _keep_states_in(layer, conv_dtype: Optional[torch.dtype], recurrent_dtype: Optional[torch.dtype]) -> None:
    """Keeps a transformers linear-attention cache layer's conv and recurrent states in given dtypes
    (None: as transformers allocates it), before its first update.

    transformers allocates each state buffer at its first update in the dtype of that update's
    tensor and copies every later state into it; allocating the buffer in the policy's dtype
    instead makes that copy the rounding point, once per forward call (prefill chunk or decode
    step), as headwise's runtime decoder stores its states. The layer keeps its object (and
    everything transformers set on it) and gets a subclass that adds only that reallocation."""
    cls = type(layer)
    if cls not in _STATE_LAYER_CLASSES:
        def lazy_initialization(self, *args, **kwargs):
            cls.lazy_initialization(self, *args, **kwargs)
            _round_states_into(self)

        _STATE_LAYER_CLASSES[cls] = type(f"HeadwiseStates{cls.__name__}", (cls,),
                                         {"lazy_initialization": lazy_initialization})
    layer.__class__ = _STATE_LAYER_CLASSES[cls]
    layer._headwise_conv_dtype = conv_dtype
    layer._headwise_recurrent_dtype = recurrent_dtype


def _declared_dtype(model_dir: Optional[str], config) -> torch.dtype:
    """The checkpoint's dtype as its config.json declares it (`dtype` / `torch_dtype`, else bfloat16),
    as headwise reads it; transformers' loaded config says the dtype it was loaded in instead, which
    is only the fallback when the model did not come from a folder."""
    declared = None
    if model_dir and os.path.isfile(os.path.join(model_dir, "config.json")):
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            doc = json.load(f)
        declared = next((doc[k] for k in ("dtype", "torch_dtype") if isinstance(doc.get(k), str) and doc[k] != "auto"),
                        "bfloat16")
    else:
        declared = getattr(config, "dtype", None) or "bfloat16"
    if isinstance(declared, torch.dtype):
        return declared
    return getattr(torch, str(declared).replace("torch.", ""))


def _observation_probs(q: torch.Tensor, q_begin: int, k: torch.Tensor, pos: torch.Tensor, scaling: float, softcap,
                       sink_logit) -> torch.Tensor:
    """The observation queries' probabilities over a snap head's candidates: causal, every key
    visible (snap_attention.cpp's observe_snap through observation_probs)."""
    q_pos = torch.arange(q_begin, q_begin + q.shape[1], device=q.device)
    return attention_probs(q, k, pos[None, :] <= q_pos[:, None], scaling, softcap, sink_logit)


def _attend_keys(q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                 window: Optional[int], sinks: int, scaling: float, softcap, sink_logit, query_chunk: int,
                 received: Optional[torch.Tensor]) -> torch.Tensor:
    """One KV head's queries q [g, t, D] at q_pos over keys k/v [n, D] at `pos`, `query_chunk` queries
    at a time (eviction_attention.cpp's attend_head): causal, a window head shows exactly its window
    and sinks. torch's fused kernel where no probabilities are needed; otherwise the explicit one,
    adding to `received` what each key got (H2O)."""
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    for t0 in range(0, q.shape[1], query_chunk):
        t1 = min(q.shape[1], t0 + query_chunk)
        qp = q_pos[t0:t1, None]
        allowed = pos[None, :] <= qp
        if window is not FULL:
            allowed = allowed & ((pos[None, :] > qp - window) | (pos[None, :] < sinks))
        if received is None and sink_logit is None and not softcap:  # the runtime's fused kernel
            out[:, t0:t1] = fused_masked_attention(q[None, None, :, t0:t1], k[None, None], v[None, None], allowed,
                                                   scaling)[0, 0]
            continue
        probs = attention_probs(q[:, t0:t1], k, allowed, scaling, softcap, sink_logit)
        out[:, t0:t1] = torch.matmul(probs.to(v.dtype), v)
        if received is not None:
            received += probs.sum(dim=(0, 1))
    return out


class _Head:
    """One KV head of a selecting layer: its slots for each sequence, filled in ascending position;
    a snap head also its staged prompt while the prompt is in."""
    __slots__ = ("window", "rule", "h2o", "snap", "capacity", "k", "v", "position", "score", "held",
                 "staged_k", "staged_v", "received")

    def __init__(self, window: Optional[int], rule: str, capacity: int):
        self.window, self.rule, self.capacity = window, rule, capacity
        self.h2o, self.snap = rule == H2O, rule == SNAP
        self.k = self.v = self.position = self.score = None  # [B, slots, D] / [B, slots]
        self.held: list[int] = []
        self.staged_k = self.staged_v = None  # snap, during the prompt: [B, n, D] in the KV dtype
        self.received: list[Optional[torch.Tensor]] = []  # snap: per sequence, float32 per candidate

    def drop_staging(self) -> None:
        self.staged_k = self.staged_v = None
        self.received = [None] * len(self.received)

    def staged_bytes(self) -> int:
        tensors = [self.staged_k, self.staged_v] + list(self.received)
        return sum(t.untyped_storage().nbytes() for t in tensors if t is not None)


class HeadwiseH2OLayer(_PolicyLayer):
    """A global layer with selecting heads (h2o, snap), as headwise's runtime serves it (its
    eviction cache, runtime/eviction_attention.cpp and snap_attention.cpp)."""

    def __init__(self, layer_id: int, windows: list[Optional[int]], rules: list[str], policy: Policy, *,
                 preallocate: bool, allow_beyond_context: bool, attn_check, prompt: Optional[PromptState] = None):
        super().__init__(layer_id, windows, policy, preallocate=preallocate,
                         allow_beyond_context=allow_beyond_context, attn_check=attn_check)
        self.rules = list(rules)
        # The slots are the policy's at its context whatever the cached length (runtime::make_layer).
        self.heads = [_Head(w, r, head_slots(w, self.sinks, self.context, self.block))
                      for w, r in zip(windows, rules)]
        self.prompt = prompt if prompt is not None else PromptState("whole", self.staged_bytes)
        self.snap_ring = 0  # the ring's slots after the prompt: its observation window
        self.staging = False

    def _unfinished_plan(self) -> None:
        raise RuntimeError(f"HeadwiseCache layer {self.layer_id}: the last step's attention never ran")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if any(h.snap for h in self.heads):  # before this call changes anything in the layer
            self.prompt.refuse_untold_chunk(self.layer_id, self.cumulative_length, key_states.shape[2])
        return super().update(key_states, value_states, *args, **kwargs)

    def _slots(self, head: _Head, length: int) -> int:
        # Storage grows with the cached length as the grouped layers' does; it never needs more
        # than the head's slots, and below them nothing is evicted yet.
        return min(head.capacity, head_slots(head.window, self.sinks, length, self.block))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._take_shapes(key_states, value_states)
        for head in self.heads:
            head.k = head.v = None
            head.held = [0] * self.batch_size
            head.received = [None] * self.batch_size
            self._grow(head, self.context if self.preallocate else 0)
        self.keys = self.values = None
        self.is_initialized = True

    def _grow(self, head: _Head, length: int) -> None:
        slots = self._slots(head, length)
        if head.k is not None and slots <= head.k.shape[1]:
            return
        b = self.batch_size
        new = {
            "k": torch.zeros(b, slots, self.head_dim, dtype=self.kv_dtype, device=self.device),
            "v": torch.zeros(b, slots, self.value_dim, dtype=self.kv_dtype, device=self.device),
            "position": torch.full((b, slots), -1, dtype=torch.long, device=self.device),
            "score": torch.zeros(b, slots, dtype=torch.float32, device=self.device),
        }
        if head.k is not None:
            old = head.k.shape[1]
            for name, t in new.items():
                t[:, :old] = getattr(head, name)
        for name, t in new.items():
            setattr(head, name, t)

    def _write(self, filled, new_k, new_v) -> None:  # attend() inserts; nothing is left to write
        return None

    # --- snap heads: staging, scoring and the choice at the prompt's end ------------------
    def _in_prompt(self, first: int, steps: int) -> bool:
        """Whether this call lies inside the prompt (snap heads stage it); a call across its end
        cannot be served as the runtime serves it."""
        p = self.prompt
        if p.end is None or not any(h.snap for h in self.heads):
            return False
        if first < p.end < first + steps:
            raise ValueError(f"HeadwiseCache layer {self.layer_id}: a forward call of positions "
                             f"{first}..{first + steps - 1} crosses the prompt's end at {p.end} (HeadwiseCache.set_prompt_length); feed the prompt "
                             "and the tokens after it in separate calls")
        return p.begin <= first and first + steps <= p.end

    def _candidates(self, head: _Head, b: int, dtype) -> tuple:
        """A snap head's keys during the prompt: what it held before, then the staged prompt."""
        n = head.held[b]
        staged = head.staged_k.shape[1]
        k = torch.cat([head.k[b, :n].to(dtype), head.staged_k[b].to(dtype)])
        v = torch.cat([head.v[b, :n].to(dtype), head.staged_v[b].to(dtype)])
        begin = self.prompt.begin
        pos = torch.cat([head.position[b, :n], torch.arange(begin, begin + staged, device=k.device)])
        return k, v, pos

    def _observe(self, head: _Head, b: int, q: torch.Tensor, first: int, k: torch.Tensor, pos: torch.Tensor,
                 scaling: float, softcap, sink_logits) -> None:
        """Adds what the observation queries of this call give each candidate (summed over those
        queries and the head's query heads) to its running score (snap_attention.cpp's observe_snap)."""
        r = head.received[b]
        grown = torch.zeros(k.shape[0] - (0 if r is None else r.shape[0]), dtype=torch.float32, device=k.device)
        r = grown if r is None else torch.cat([r, grown])
        start, stop = max(self.prompt.observed_begin(), first), first + q.shape[1]
        if start < stop:
            probs = _observation_probs(q[:, start - first:stop - first], start, k, pos, scaling, softcap, sink_logits)
            r = r + probs.sum(dim=(0, 1))
        head.received[b] = r

    def end_prompt(self) -> None:
        """Every snap head keeps its observation window and its best prefix keys; staging dropped."""
        if not self.staging:
            return
        first_observed = self.prompt.observed_begin()
        for head in self.heads:
            if not head.snap or head.staged_k is None:
                continue
            for b in range(self.batch_size):
                k, v, pos = self._candidates(head, b, self.kv_dtype)
                raw = head.received[b]
                raw = torch.zeros(0, dtype=torch.float32, device=k.device) if raw is None else raw
                if raw.shape[0] < pos.shape[0]:
                    raw = torch.cat([raw, raw.new_zeros(pos.shape[0] - raw.shape[0])])
                keep, score = snap_choice(pos, raw, first_observed, head.capacity)
                self._write_head(head, b, k.index_select(0, keep), v.index_select(0, keep), pos.index_select(0, keep),
                                 score.index_select(0, keep))
            head.drop_staging()
        self.snap_ring = self.prompt.end - first_observed
        self.staging = False

    def _write_head(self, head: _Head, b: int, k, v, pos, score) -> None:
        m = k.shape[0]
        head.k[b, :m] = k.to(self.kv_dtype)
        head.v[b, :m] = v.to(self.kv_dtype)
        head.position[b, :m] = pos
        head.score[b, :m] = score
        head.position[b, m:] = -1
        head.score[b, m:] = 0
        head.held[b] = m

    def staged_bytes(self) -> int:
        """The snap heads' staged prompt now: K and V in the KV dtype, a float32 score per key."""
        return sum(head.staged_bytes() for head in self.heads)

    # --- attention -------------------------------------------------------------------------
    def attend(self, plan: _Plan, query: torch.Tensor, scaling: float, softcap: Optional[float] = None,
               s_aux: Optional[torch.Tensor] = None, query_chunk: int = 512) -> torch.Tensor:
        """query [B, H, T, D] at positions filled.. -> output [B, T, H, Dv]; then each head evicts
        down to its slots (runtime::EvictionAttentionCore::attend with H2O; snap heads stage the
        prompt and choose at its end)."""
        bsz, num_heads, steps, _ = query.shape
        num_kv = len(self.windows)
        group = num_heads // num_kv
        dtype = query.dtype
        first = plan.filled
        q = query.reshape(bsz, num_kv, group, steps, query.shape[-1])
        new_k, new_v = plan.new_k, plan.new_v
        if self.kv_dtype != dtype:  # every key a query sees went through the cache's storage
            new_k, new_v = new_k.to(self.kv_dtype).to(dtype), new_v.to(self.kv_dtype).to(dtype)
        new_pos = torch.arange(first, first + steps, device=query.device)
        sink_logits = None if s_aux is None else s_aux.reshape(num_kv, group)
        self.prompt.take_first_call(first, steps)
        in_prompt = self._in_prompt(first, steps)
        if in_prompt and self.prompt.schedule == "layer" and steps != self.prompt.end - self.prompt.begin:
            raise ValueError(f"HeadwiseCache: prefill_schedule='layer' needs the prompt of "
                             f"{self.prompt.end - self.prompt.begin} tokens in one forward call (transformers runs a call through every layer), got {steps}; "
                             "use prefill_schedule='whole' for a chunked prefill")
        if not in_prompt:
            self.end_prompt()  # the first step past the prompt: the layer still staging chooses first
        out = query.new_empty(bsz, num_kv, group, steps, new_v.shape[-1])
        for h, head in enumerate(self.heads):
            self._grow(head, first + steps)
            if head.snap and in_prompt:
                self._attend_prompt(head, h, q, new_k, new_v, first, out, scaling, softcap, sink_logits, query_chunk)
                continue
            for b in range(bsz):
                n = head.held[b]
                k = torch.cat([head.k[b, :n].to(dtype), new_k[b, h]])
                v = torch.cat([head.v[b, :n].to(dtype), new_v[b, h]])
                pos = torch.cat([head.position[b, :n], new_pos])
                score = torch.cat([head.score[b, :n], torch.zeros(steps, dtype=torch.float32, device=q.device)])
                received = torch.zeros(pos.shape[0], dtype=torch.float32, device=q.device) if head.h2o else None
                window = head.window if head.rule == WINDOW else FULL
                out[b, h] = _attend_keys(q[b, h], new_pos, k, v, pos, window, self.sinks, scaling, softcap,
                                         None if sink_logits is None else sink_logits[h], query_chunk, received)
                if head.h2o:
                    keep = keep_indices(pos, score + received, head.capacity, head.capacity // 2)
                    score = score + received
                elif head.snap:
                    keep, score = ring_insert(pos, score, n, head.capacity, self.snap_ring)
                else:
                    score = torch.zeros_like(score).masked_fill(pos < self.sinks, float("inf"))
                    keep = keep_indices(pos, score, head.capacity, head.capacity - min(self.sinks, head.capacity))
                self._write_head(head, b, k.index_select(0, keep), v.index_select(0, keep), pos.index_select(0, keep),
                                 score.index_select(0, keep))
        if in_prompt and any(h.snap for h in self.heads):
            self.staging = True
            self.prompt.note_staged()
            if first + steps == self.prompt.end and self.prompt.schedule == "layer":
                self.end_prompt()
        plan.committed = True
        if self.pending is plan:
            self.pending = None
        return out.reshape(bsz, num_heads, steps, -1).transpose(1, 2).contiguous()

    def _attend_prompt(self, head: _Head, h: int, q, new_k, new_v, first, out, scaling, softcap, sink_logits,
                       query_chunk) -> None:
        """A snap head during the prompt: stages this call's keys, attends over every prompt key so
        far (as full KV) and lets the observation queries score them."""
        # Copies: the staging owns its storage (a view would hold every head's activations).
        k_new = new_k[:, h].to(self.kv_dtype, copy=True)
        v_new = new_v[:, h].to(self.kv_dtype, copy=True)
        if head.staged_k is None:
            if first != self.prompt.begin:
                raise RuntimeError(f"HeadwiseCache layer {self.layer_id}: snap head staging starts at {first}, "
                                   f"the prompt at {self.prompt.begin}")
            head.staged_k, head.staged_v = k_new, v_new
        else:
            head.staged_k = torch.cat([head.staged_k, k_new], dim=1)
            head.staged_v = torch.cat([head.staged_v, v_new], dim=1)
        steps = new_k.shape[2]
        q_pos = torch.arange(first, first + steps, device=q.device)
        sl = None if sink_logits is None else sink_logits[h]
        for b in range(q.shape[0]):
            k, v, pos = self._candidates(head, b, q.dtype)
            out[b, h] = _attend_keys(q[b, h], q_pos, k, v, pos, FULL, 0, scaling, softcap, sl, query_chunk, None)
            self._observe(head, b, q[b, h], first, k, pos, scaling, softcap, sl)

    def kv_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for head in self.heads for t in (head.k, head.v) if t is not None)

    def selection_bytes(self) -> int:
        """Per slot a position and a score, per sequence and head an offset, length and fill (three
        int64s), as the runtime's eviction cache keeps them (memory::selection_bytes)."""
        if not self.is_initialized:
            return 0
        slots = sum(t.untyped_storage().nbytes() for head in self.heads for t in (head.position, head.score))
        return slots + 3 * 8 * self.batch_size * len(self.heads)

    def reset(self) -> None:
        for head in self.heads:
            head.drop_staging()
            if head.k is not None:
                head.k.zero_()
                head.v.zero_()
                head.position.fill_(-1)
                head.score.zero_()
                head.held = [0] * len(head.held)
        self.staging = False
        self.snap_ring = 0
        self.prompt.forget()
        self.cumulative_length = 0
        self.pending = None

    def _map(self, fn) -> None:
        for head in self.heads:
            if head.k is not None:
                for name in ("k", "v", "position", "score"):
                    setattr(head, name, fn(getattr(head, name)))

    def offload(self):
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        self._map(lambda t: t.to(self.device, non_blocking=True))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        order = beam_idx.tolist()
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))
        for head in self.heads:
            head.held = [head.held[i] for i in order]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))
        for head in self.heads:
            head.held = [n for n in head.held for _ in range(repeats)]
        if self.batch_size is not None:
            self.batch_size *= repeats

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        order = torch.arange(self.batch_size)[indices.cpu()].tolist() if self.batch_size else []
        self._map(lambda t: t[indices, ...])
        for head in self.heads:
            head.held = [head.held[i] for i in order]
        self.batch_size = len(order)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("HeadwiseCache: an h2o or snap head drops what it evicts, so it cannot be cropped")

    def __repr__(self):
        ws = ",".join(("full" if w is FULL else str(w)) + ("" if r == WINDOW else ":" + r)
                      for w, r in zip(self.windows, self.rules))
        return f"HeadwiseH2OLayer(layer={self.layer_id}, heads=[{ws}], sinks={self.sinks})"


def _model_dir(model) -> Optional[str]:
    path = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(model, "name_or_path", None)
    return path if path and os.path.isdir(path) else None


class HeadwiseCache(DynamicCache):
    """A DynamicCache whose global attention layers keep only what a headwise policy gives each KV head.

    Build it with `HeadwiseCache.from_policy(path, model)`; use one cache per sequence batch, as
    with any transformers cache (pass it as `past_key_values` to `model(...)` or `model.generate`).
    """

    def __init__(self, policy: Policy, config, *, preallocate: bool = False, allow_beyond_context: bool = False,
                 checkpoint_dtype: Optional[torch.dtype] = None, prefill_schedule: str = "whole"):
        super().__init__(config=config)
        text = config.get_text_config(decoder=True)
        self.policy = policy
        self._config = text
        if prefill_schedule not in ("whole", "layer"):
            raise ValueError(f"HeadwiseCache: prefill_schedule must be 'whole' or 'layer', got {prefill_schedule!r}")
        self.prompt = PromptState(prefill_schedule, self.staged_bytes)
        layer_types = list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)
        num_kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        globals_ = [i for i, t in enumerate(layer_types) if t == "full_attention"]
        if sorted(policy.windows) != globals_:
            raise PolicyError(f"{policy.path}: per_layer_policies names layers {sorted(policy.windows)}, the model's "
                              f"global attention layers are {globals_} (a policy for another model?)")
        for layer_id, windows in policy.windows.items():
            if len(windows) != num_kv:
                raise PolicyError(f"{policy.path}: layer {layer_id}: {len(windows)} kv_head_windows for "
                                  f"{num_kv} KV heads")
            common = dict(preallocate=preallocate, allow_beyond_context=allow_beyond_context,
                          attn_check=self._check_attention)
            rules = policy.rules.get(layer_id)
            if rules and (H2O in rules or SNAP in rules):
                self.layers[layer_id] = HeadwiseH2OLayer(layer_id, windows, rules, policy, prompt=self.prompt, **common)
            else:
                self.layers[layer_id] = HeadwiseLayer(layer_id, windows, policy, **common)
        # States: the policy's state_dtype; without one (native), conv states in the checkpoint's
        # dtype and recurrent states as the model's rule returns them (float32 for gated DeltaNet),
        # which is what headwise allocates for them (arch::StateTensorSpec).
        state = policy.state_torch_dtype
        native_conv = checkpoint_dtype or _declared_dtype(None, text)
        conv, recurrent = (state, state) if state is not None else (native_conv, None)
        for layer in self.layers:
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                _keep_states_in(layer, conv, recurrent)

    def _check_attention(self):
        if self._config._attn_implementation != "headwise":
            raise RuntimeError("HeadwiseCache needs the model's `headwise` attention (HeadwiseCache.from_policy sets "
                               f"it; the model now uses {self._config._attn_implementation!r})")

    @classmethod
    def from_policy(cls, policy_path, model, *, check_fingerprint: bool = True, preallocate: bool = False,
                    allow_beyond_context: bool = False, prefill_schedule: str = "whole") -> "HeadwiseCache":
        """A cache for `model` under the policy at `policy_path`; switches the model to `headwise` attention.

        check_fingerprint: compare the policy's model_fingerprint.config_sha256 with the model folder's
        config.json (when the model was loaded from a folder). preallocate: allocate every ring at the
        policy's context now (the policy's memory block exactly) instead of growing with the cached
        length. allow_beyond_context: run past the policy's context (full heads keep growing).
        prefill_schedule (snap heads): `whole` (every layer stages the whole prompt, then chooses) or
        `layer` (each layer chooses right after the prompt's forward passes it; the prompt in one call).
        """
        from .attention import install

        policy = policy_path if isinstance(policy_path, Policy) else read_policy(policy_path)
        model_dir = _model_dir(model)
        if check_fingerprint:
            actual = config_sha256(model_dir) if model_dir else None
            if actual is None:
                warnings.warn(f"HeadwiseCache: cannot check {policy.path}'s model fingerprint (the model was not "
                              "loaded from a local folder)")
            elif policy.config_sha256 and actual != policy.config_sha256:
                raise PolicyError(f"{policy.path}: model_fingerprint.config_sha256 does not match "
                                  f"{os.path.join(model_dir, 'config.json')} (a policy for another model)")
        install(model)
        if (why := follow_generate(model)) is not None:
            warnings.warn(f"HeadwiseCache: generate(prefill_chunk_size=...) cannot tell snap heads the prompt's "
                          f"length ({why}); call cache.set_prompt_length(P) before a chunked prefill")
        return cls(policy, model.config, preallocate=preallocate, allow_beyond_context=allow_beyond_context,
                   prefill_schedule=prefill_schedule, checkpoint_dtype=_declared_dtype(model_dir, model.config.get_text_config(decoder=True)))

    def headwise_layers(self) -> list:
        return [l for l in self.layers if isinstance(l, (HeadwiseLayer, HeadwiseH2OLayer))]

    def kv_bytes(self) -> int:
        """Bytes of every global layer's K/V buffers: mem-estimate's global_kv_bytes at the cached
        length (at the policy's context with preallocate=True)."""
        return sum(l.kv_bytes() for l in self.headwise_layers())

    def selection_bytes(self) -> int:
        """The selecting layers' (h2o, snap) per-slot positions and scores and per-head region table:
        mem-estimate's selection_state_bytes at the cached length."""
        return sum(l.selection_bytes() for l in self.headwise_layers() if isinstance(l, HeadwiseH2OLayer))

    # --- snap heads: the prompt ----------------------------------------------------------------
    def set_prompt_length(self, tokens: int) -> None:
        """The prompt is the first `tokens` positions: snap heads stage them and choose at their end.
        Needed only when the prompt is prefilled in several forward calls of your own
        (generate(prefill_chunk_size=...) on the model from_policy set up tells it itself); without it
        the first forward call is the prompt, and a call of several tokens right after it is refused."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise ValueError(f"HeadwiseCache.set_prompt_length: a positive token count, got {tokens!r}")
        if self.get_seq_length() > 0:
            raise ValueError("HeadwiseCache.set_prompt_length: the cache already holds tokens (set it before the "
                             "prompt's first forward call)")
        self.prompt.tell(tokens)

    def tell_generate_prompt(self, tokens: int) -> None:
        """generate(prefill_chunk_size=...) prefills `tokens` in chunks (prompt.follow_generate):
        the prompt's length, unless the cache already holds tokens or was told."""
        if self.get_seq_length() == 0 and self.prompt.end is None:
            self.set_prompt_length(tokens)

    def end_prompt(self) -> None:
        """The prompt is in: every snap head chooses now (else each layer does at its next step)."""
        for layer in self.headwise_layers():
            if isinstance(layer, HeadwiseH2OLayer):
                layer.end_prompt()

    def staged_bytes(self) -> int:
        """The snap heads' staged prompt now (K/V in the KV dtype and a float32 score per key)."""
        return sum(l.staged_bytes() for l in self.headwise_layers() if isinstance(l, HeadwiseH2OLayer))

    def peak_bytes(self) -> int:
        """K/V, bookkeeping and the most ever staged at once: with preallocate=True, mem-estimate
        --prompt-tokens P's prefill peak of the global layers (whole_prompt_peak_bytes under the whole
        schedule, layer_by_layer_peak_bytes under the layer one, less the local layers' bytes)."""
        return self.kv_bytes() + self.selection_bytes() + self.prompt.peak_staged
