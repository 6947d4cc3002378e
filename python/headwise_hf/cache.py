"""HeadwiseCache: a transformers cache that applies a headwise policy physically.

Each global attention layer named by the policy keeps its KV heads as headwise's runtime does: a
layer of window heads in per-window rings (window_layer.py, HeadwiseLayer), a layer with an h2o
or snap head in the runtime's eviction cache (selecting_layer.py, HeadwiseH2OLayer). Other layers
are transformers' own, except that linear-attention/conv layers keep their states in the policy's
`state_dtype` (the runtime decoder's rule: a state is stored, so rounded, at the end of every
forward call and read back from there).
"""
from __future__ import annotations

import json
import os
import warnings
from typing import Optional

import torch
from transformers import DynamicCache
from transformers import cache_utils

# transformers before 5.3 (kvpress's pin) has no linear-attention layers: nothing to keep states of.
LinearAttentionCacheLayerMixin = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())

from .policy import H2O, SNAP, Policy, PolicyError, config_sha256, read_policy
from .prompt import PromptState, follow_generate
from .selecting_layer import HeadwiseH2OLayer
from .window_layer import HeadwiseLayer, held_positions

__all__ = ["HeadwiseCache", "HeadwiseH2OLayer", "HeadwiseLayer", "held_positions"]


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
