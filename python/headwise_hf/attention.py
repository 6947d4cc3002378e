"""The `headwise` attention implementation: HeadwiseCache layers attend over their rings; every
other call is transformers' sdpa attention with sdpa's masks, unchanged."""
from __future__ import annotations

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "headwise"


def headwise_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    plan = getattr(key, "_headwise_plan", None)
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    softcap = kwargs.get("softcap")
    s_aux = kwargs.get("s_aux")
    out = plan.layer.attend(plan, query, scaling, softcap=softcap, s_aux=s_aux)
    return out, None


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
