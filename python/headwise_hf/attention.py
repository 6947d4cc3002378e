"""The `headwise` attention implementation: HeadwiseCache layers attend over their rings; every
other call is transformers' sdpa attention with sdpa's masks, unchanged, except where the model
passes learned sink logits (gpt-oss's `s_aux`), which sdpa cannot take: those layers run
transformers' own gpt-oss eager attention, with sdpa's mask turned into the additive one it takes."""
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
            return _attention_with_sink_logits(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    softcap = kwargs.get("softcap")
    s_aux = kwargs.get("s_aux")
    out = plan.layer.attend(plan, query, scaling, softcap=softcap, s_aux=s_aux)
    return out, None


def _attention_with_sink_logits(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    """transformers' own gpt-oss attention (modeling_gpt_oss.eager_attention_forward: the module's
    sink logits join each softmax), given the additive mask it expects: this implementation's masks
    are sdpa's (bool, True = visible; None = plainly causal). query [B, H, T, D], key/value
    [B, KV, N, D] -> ([B, T, H, D], probabilities)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    steps, keys = query.shape[2], key.shape[2]
    if attention_mask is None:
        attention_mask = torch.ones(steps, keys, dtype=torch.bool, device=query.device).tril(keys - steps)
    if attention_mask.dtype == torch.bool:
        visible = attention_mask[..., :keys]
        attention_mask = torch.zeros(visible.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~visible, float("-inf"))
    else:
        attention_mask = attention_mask[..., :keys]
    return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                   **kwargs)


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
