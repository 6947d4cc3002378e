"""The selecting layer of HeadwiseCache (cache.py): a global attention layer whose policy entry
lists an h2o or snap head (kv_head_rules), served as headwise's runtime serves it.

An h2o head is served from the runtime's eviction cache (runtime/eviction_cache.hpp,
EvictionMethod::kH2O with the layer's window heads): every head owns exactly its slots,
round_up(min(w + S, C), block); an h2o head keeps, whenever its tokens overflow them, the slots/2
most recent tokens plus the highest accumulated attention among the rest (summed over the queries
so far and the head's query heads; ties keep the more recent), evicting after every chunk and
decode step; a window head of that layer keeps its sinks and most recent tokens and shows its
queries exactly its window. Per slot it keeps a position (int64) and a score (float32):
selection_bytes(), equal to mem-estimate's selection_state_bytes.

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

from typing import Optional

import torch

from .policy import FULL, H2O, SNAP, WINDOW, Policy, head_slots
from .prompt import PromptState
from .selection import attention_probs, keep_indices, ring_insert, snap_choice
from .window_layer import _Plan, _PolicyLayer, fused_masked_attention


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
