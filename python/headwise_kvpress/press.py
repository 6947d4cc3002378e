"""HeadwisePress: a kvpress press that applies a headwise policy to each global layer's KV heads.

kvpress compresses once, right after the prompt's forward passes a layer (BasePress.forward_hook,
the layer-by-layer schedule of docs/keep-rules.md "The prefill peak"), and never while decoding.
Within that model the press serves what headwise's runtime decoder serves (runtime/eviction_cache.hpp):

- a `window` head keeps its sinks and its most recent tokens in its slots, round_up(min(w + S, C),
  block), and shows each query exactly its window and sinks, in the prompt too (a per-head
  attention mask: a plain kvpress prefill would let every head see the whole prompt);
- a `snap` head sees the whole prompt (as full KV) and at its end keeps, in its slots, the
  observation window (the prompt's last 32 tokens) and the prefix keys the window's queries attend
  to most (summed over those queries and the head's query heads, max-pooled with kernel 7; ties to
  the higher raw score, then the lower position). While decoding, the runtime rotates the
  observation window and the decoded tokens in a ring of as many slots; kvpress appends every
  decoded token to the cache, so the press masks (for attention) what that ring drops: the tokens
  are the runtime's, the held bytes grow by the decoded tokens as with every kvpress press;
- an `h2o` head evicts after every decode step, which a press cannot: refused in one line;
- K and V pass through the policy's KV dtype (rounded as the runtime stores them).

A layer keeps as many slots as its largest head keeps; a head with fewer has the rest masked, so
the layer's cache holds max-kept tokens per head (`kept_tokens()` counts what each head keeps).
Use it as any press, with the whole prompt in one forward call (kvpress's protocol):

    press = HeadwisePress("policy.yaml")
    with press(model):
        model(input_ids=prompt, past_key_values=cache)   # compresses each global layer
        ... decode with the same cache inside the context (the masks apply while decoding)
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Optional, Union

import torch
from kvpress.presses.base_press import BasePress

from headwise_hf.policy import FULL, SNAP, WINDOW, Policy, PolicyError, config_sha256, head_slots, read_policy
from headwise_hf.selection import (INF, attention_probs, keep_indices, observed_begin, ring_insert,
                                   snap_choice)


@dataclasses.dataclass
class _LayerState:
    """What one global layer's cache holds per (sequence, KV head, slot): its position (-1: masked
    or dropped) and, for snap heads, its keep score."""
    position: torch.Tensor  # [B, H, N] int64
    score: torch.Tensor  # [B, H, N] float32
    ring: int = 0


@dataclasses.dataclass
class HeadwisePress(BasePress):
    """Applies the policy at `policy` (a path or a read Policy) in a kvpress pipeline."""

    policy: Union[str, os.PathLike, Policy] = ""
    check_fingerprint: bool = True
    # `ring`: a snap head's decode as the runtime's (what its ring drops is masked); `keep`:
    # kvpress's own, every decoded token stays visible (equal to the runtime's only while the
    # head's slots have room for the answer: the ring's slack).
    decode: str = "ring"

    def __post_init__(self):
        if self.decode not in ("ring", "keep"):
            raise ValueError(f"HeadwisePress: decode must be 'ring' or 'keep', got {self.decode!r}")
        if not isinstance(self.policy, Policy):
            self.policy = read_policy(self.policy)
        for layer, heads in self.policy.h2o_heads().items():
            raise PolicyError(f"{self.policy.path}: layer {layer} head {heads[0]}: kv_head_rules h2o evicts after "
                              "every decode step, which a kvpress press cannot (it compresses once, after the "
                              "prefill); serve this policy with HeadwiseCache or headwise's runtime")
        self._state: dict[int, _LayerState] = {}

    # --- the model ---------------------------------------------------------------------------
    def post_init_from_model(self, model) -> None:
        """Refuses a policy for another model in one line: the layers, KV heads, fingerprint."""
        p = self.policy
        text = model.config.get_text_config(decoder=True)
        types = list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)
        globals_ = [i for i, t in enumerate(types) if t == "full_attention"]
        if sorted(p.windows) != globals_:
            raise PolicyError(f"{p.path}: per_layer_policies names layers {sorted(p.windows)}, the model's global "
                              f"attention layers are {globals_} (a policy for another model?)")
        num_kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        for layer, windows in p.windows.items():
            if len(windows) != num_kv:
                raise PolicyError(f"{p.path}: layer {layer}: {len(windows)} kv_head_windows for {num_kv} KV heads "
                                  "(a policy for another model?)")
        folder = getattr(text, "_name_or_path", None) or getattr(model, "name_or_path", None)
        actual = config_sha256(folder) if folder and os.path.isdir(folder) else None
        if self.check_fingerprint and actual and p.config_sha256 and actual != p.config_sha256:
            raise PolicyError(f"{p.path}: model_fingerprint.config_sha256 does not match "
                              f"{os.path.join(folder, 'config.json')} (a policy for another model)")

    def _rules(self, layer: int) -> list[str]:
        return self.policy.rules.get(layer) or [WINDOW] * len(self.policy.windows[layer])

    def _capacity(self, window: Optional[int]) -> int:
        p = self.policy
        return head_slots(window, p.sink_tokens, p.context, p.block_size)

    @contextlib.contextmanager
    def __call__(self, model):
        """Hooks the policy's layers (the global ones; sliding layers stay transformers' own) for
        the context: before each attention call its per-head mask, after the prompt's the
        compression, after each later call the snap heads' ring."""
        self.post_init_from_model(model)
        decoder = model.model.language_model if hasattr(model.model, "language_model") else model.model
        self._state = {}
        hooks = []
        try:
            for i in sorted(self.policy.windows):
                attn = decoder.layers[i].self_attn
                hooks.append(attn.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
                hooks.append(attn.register_forward_hook(self.forward_hook, with_kwargs=True))
            yield
        finally:
            for h in hooks:
                h.remove()

    # --- the hooks ---------------------------------------------------------------------------
    def _pre_hook(self, module, args, kwargs):
        """Rounds the layer's new K/V through the policy's KV dtype and gives the attention a
        per-head mask [B, heads, T, N] of what each KV head holds and shows."""
        cache = kwargs["past_key_values"]
        layer = module.layer_idx
        _round_updates(cache.layers[layer], self.policy.kv_dtype)
        q_pos = kwargs["cache_position"]
        if int(q_pos[0]) == 0:
            self._state.pop(layer, None)  # a fresh prompt
        state = self._state.get(layer)
        batch, steps = kwargs["hidden_states"].shape[:2]
        kv_heads = len(self.policy.windows[layer])
        new = q_pos.view(1, 1, -1).expand(batch, kv_heads, steps)
        pos = new if state is None else torch.cat([state.position, new], dim=2)  # [B, H, N]
        allowed = (pos[:, :, None, :] >= 0) & (pos[:, :, None, :] <= q_pos.view(1, 1, -1, 1))
        for h, (w, rule) in enumerate(zip(self.policy.windows[layer], self._rules(layer))):
            if rule == WINDOW and w is not FULL:
                kp, qp = pos[:, h, None, :], q_pos.view(1, -1, 1)
                allowed[:, h] &= (kp > qp - w) | (kp < self.policy.sink_tokens)
        group = module.config.num_attention_heads // kv_heads
        kwargs["attention_mask"] = allowed.repeat_interleave(group, dim=1)
        return args, kwargs

    def forward_hook(self, module, input, kwargs, output):
        layer = module.layer_idx
        cache_layer = kwargs["past_key_values"].layers[layer]
        q_pos = kwargs["cache_position"]
        if int(q_pos[0]) == 0:
            self._compress(module, kwargs, cache_layer)
        else:
            self._decoded(layer, q_pos, cache_layer)
        return output

    # --- the prompt's end: each head keeps what its rule keeps ---------------------------------
    def _compress(self, module, kwargs, cache_layer) -> None:
        layer = module.layer_idx
        keys, values = cache_layer.keys, cache_layer.values  # [B, H, P, D], rounded
        batch, kv_heads, prompt = keys.shape[:3]
        pos = torch.arange(prompt, device=keys.device)
        first_observed = observed_begin(prompt)
        q_obs = None
        kept, scores = [], []
        for h, (w, rule) in enumerate(zip(self.policy.windows[layer], self._rules(layer))):
            capacity = self._capacity(w)
            per_b, score_b = [], []
            for b in range(batch):
                if rule == SNAP:
                    if q_obs is None:
                        q_obs = _observation_queries(module, kwargs, prompt - first_observed)
                    raw = self._observed(module, q_obs[b], first_observed, keys[b, h], pos, h, kv_heads)
                    keep, score = snap_choice(pos, raw, first_observed, capacity)
                else:
                    score = torch.zeros(prompt, dtype=torch.float32, device=keys.device)
                    sinks = min(self.policy.sink_tokens, capacity)
                    keep = keep_indices(pos, score.masked_fill(pos < sinks, INF), capacity, capacity - sinks)
                per_b.append(keep)
                score_b.append(score.index_select(0, keep))
            kept.append(per_b)
            scores.append(score_b)
        slots = max(len(k) for per_b in kept for k in per_b)
        index = torch.zeros(batch, kv_heads, slots, dtype=torch.long, device=keys.device)
        position = torch.full((batch, kv_heads, slots), -1, dtype=torch.long, device=keys.device)
        score = torch.zeros(batch, kv_heads, slots, dtype=torch.float32, device=keys.device)
        for h in range(kv_heads):
            for b in range(batch):
                n = len(kept[h][b])
                index[b, h, :n] = kept[h][b]
                position[b, h, :n] = kept[h][b]
                score[b, h, :n] = scores[h][b]
        gather = index.unsqueeze(-1)
        cache_layer.keys = keys.gather(2, gather.expand(-1, -1, -1, keys.shape[-1])).contiguous()
        cache_layer.values = values.gather(2, gather.expand(-1, -1, -1, values.shape[-1])).contiguous()
        self._state[layer] = _LayerState(position, score, prompt - first_observed)

    def _observed(self, module, q_obs, first_observed, k, pos, h, kv_heads) -> torch.Tensor:
        """A snap head's raw scores: the observation queries' attention on each prompt key, summed
        over those queries and the head's query heads (causal)."""
        group = q_obs.shape[0] // kv_heads
        q = q_obs[h * group:(h + 1) * group]  # [g, m, D]
        q_pos = torch.arange(first_observed, first_observed + q.shape[1], device=q.device)
        softcap = getattr(module.config, "attn_logit_softcapping", None)
        probs = attention_probs(q, k.to(q.dtype), pos[None, :] <= q_pos[:, None], module.scaling, softcap)
        return probs.sum(dim=(0, 1))

    # --- decoding: the snap heads' ring ------------------------------------------------------------
    def _decoded(self, layer: int, q_pos: torch.Tensor, cache_layer) -> None:
        """The call's tokens join every head; a snap head then drops (masks) what the runtime's
        recency ring drops once its slots are full (eviction_attention.cpp's insert)."""
        state = self._state.get(layer)
        if state is None:
            raise RuntimeError(f"HeadwisePress layer {layer}: a call at position {int(q_pos[0])} before the prompt "
                               "(the press needs the whole prompt in its first forward call, from position 0)")
        batch, kv_heads = state.position.shape[:2]
        steps = q_pos.shape[0]
        new = q_pos.view(1, 1, -1).expand(batch, kv_heads, steps)
        state.position = torch.cat([state.position, new], dim=2)
        state.score = torch.cat([state.score, state.score.new_full((batch, kv_heads, steps), -INF)], dim=2)
        if state.position.shape[2] != cache_layer.keys.shape[2]:
            raise RuntimeError(f"HeadwisePress layer {layer}: the cache holds {cache_layer.keys.shape[2]} slots, the "
                               f"press tracks {state.position.shape[2]} (one cache per prompt, inside the press)")
        old = state.position.shape[2] - steps
        for h, (w, rule) in enumerate(zip(self.policy.windows[layer], self._rules(layer))):
            if rule != SNAP or self.decode == "keep":
                continue  # a window head's mask shows exactly its window: what it holds beyond is unseen
            capacity = self._capacity(w)
            for b in range(batch):
                live = (state.position[b, h, :old] >= 0).nonzero().view(-1)
                slots = torch.cat([live, torch.arange(old, old + steps, device=live.device)])
                pos = state.position[b, h].index_select(0, slots)
                keep, _ = ring_insert(pos, state.score[b, h].index_select(0, slots), live.shape[0], capacity,
                                      state.ring)
                dropped = torch.ones(slots.shape[0], dtype=torch.bool, device=slots.device)
                dropped[keep] = False
                state.position[b, h, slots[dropped]] = -1

    # --- what the press keeps -------------------------------------------------------------------------
    def kept_tokens(self) -> dict[int, list[list[int]]]:
        """layer -> per sequence, per KV head, the tokens the head holds now (its unmasked slots)."""
        return {layer: (s.position >= 0).sum(dim=2).tolist() for layer, s in sorted(self._state.items())}


def _observation_queries(module, kwargs, window: int) -> torch.Tensor:
    """The prompt's last `window` queries after RoPE, as the layer computed them: [B, heads, m, D]."""
    from kvpress.utils import get_prerope_query_states

    hidden = kwargs["hidden_states"]
    q = get_prerope_query_states(module, hidden)
    cos, sin = kwargs["position_embeddings"]
    rope = sys.modules[type(module).__module__]
    q, _ = rope.apply_rotary_pos_emb(q, q, cos, sin)
    return q[:, :, -window:]


def _round_updates(cache_layer, dtype: torch.dtype) -> None:
    """The layer's cache stores K/V rounded through the policy's KV dtype (in the model's dtype)."""
    if getattr(cache_layer, "_headwise_rounds", None) == dtype:
        return
    update = type(cache_layer).update

    def rounded(self, key_states, value_states, *args, **kwargs):
        if key_states.dtype != dtype:
            key_states = key_states.to(dtype).to(key_states.dtype)
            value_states = value_states.to(dtype).to(value_states.dtype)
        return update(self, key_states, value_states, *args, **kwargs)

    cache_layer.update = rounded.__get__(cache_layer)
    cache_layer._headwise_rounds = dtype
