"""The `headwise` attention implementation: HeadwiseCache layers attend over their rings; every
other call is transformers' sdpa attention with sdpa's masks, unchanged, except where the model
passes learned sink logits (gpt-oss's `s_aux`), which sdpa cannot take: those layers attend in
eager form with the sink logit joining each softmax, as transformers' own gpt-oss attention does."""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "headwise"


def headwise_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    plan = getattr(key, "_headwise_plan", None)
    if plan is None:
        if kwargs.get("s_aux") is not None:
            return _attention_with_sink_logits(query, key, value, attention_mask, scaling, kwargs["s_aux"])
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    softcap = kwargs.get("softcap")
    s_aux = kwargs.get("s_aux")
    out = plan.layer.attend(plan, query, scaling, softcap=softcap, s_aux=s_aux)
    return out, None


def _attention_with_sink_logits(query, key, value, attention_mask, scaling, s_aux):
    """query [B, H, T, D], key/value [B, KV, N, D], attention_mask from sdpa_mask (bool, True =
    visible; None = plainly causal) -> ([B, T, H, D], probabilities)."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    repeat = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(repeat, dim=1)
    v = value.repeat_interleave(repeat, dim=1)
    logits = torch.matmul(query, k.transpose(2, 3)) * scaling
    steps, keys = query.shape[2], key.shape[2]
    if attention_mask is None:
        attention_mask = torch.ones(steps, keys, dtype=torch.bool, device=query.device).tril(keys - steps)
    if attention_mask.dtype == torch.bool:
        logits = logits.masked_fill(~attention_mask[..., :keys], float("-inf"))
    else:
        logits = logits + attention_mask[..., :keys]
    sinks = s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, steps, 1).to(logits.dtype)
    combined = torch.cat([logits, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    out = torch.matmul(probs.to(v.dtype), v)
    return out.transpose(1, 2).contiguous(), probs


_registered = False


def register() -> None:
    global _registered
    if not _registered:
        AttentionInterface.register(NAME, headwise_attention_forward)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True


def install(model) -> None:
    """Registers the implementation and switches `model` to it."""
    register()
    if model.config._attn_implementation != NAME:
        model.set_attn_implementation(NAME)
    if model.config.get_text_config(decoder=True)._attn_implementation != NAME:
        raise RuntimeError(f"headwise_hf: {type(model).__name__} did not accept the `{NAME}` attention implementation")
