"""vLLM model classes that serve a headwise policy: the stock classes of each family, built with
every attention layer set as the policy and the HF config say, and the heads of split layers
permuted when the weights load.

While the stock __init__ runs, the name `Attention` in the family's vLLM module is replaced by a
factory that decides per layer (from the layer index in its prefix):
  - a sliding layer of the config (layer_types): vLLM's Attention with the config's window
    (vLLM's own Qwen3 ignores layer_types and would compute those layers as full);
  - a global layer whose heads share one window: vLLM's Attention with that window (None: full);
  - a global layer with several windows: HeadwiseSplitAttention, one Attention per window group.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
from typing import Optional

from headwise_hf.policy import FULL, PolicyError, read_policy

from . import vllm_internals
from .attention import HeadwiseSplitAttention, permute_layer_weights
from .plan import ENV_POLICY, LayerPlan, layer_kinds, plan_model

# Under vLLM's own logger, so its handlers and VLLM_LOGGING_LEVEL apply.
logger = logging.getLogger("vllm.headwise_vllm")


def _model_dir(vllm_config) -> Optional[str]:
    path = getattr(vllm_config.model_config, "model", None)
    return path if path and os.path.isdir(path) else None


def _check_engine(vllm_config, policy) -> None:
    # Tensor and pipeline parallelism: the shards were checked by plan_model (every rank's shard of
    # every layer holds the same windows); pipeline stages split layers, nothing per head.
    max_len = vllm_config.model_config.max_model_len
    if max_len > policy.context:
        logger.warning("headwise_vllm: max_model_len %d exceeds the policy's context %d (its windows were "
                       "chosen for %d tokens)", max_len, policy.context, policy.context)


class _AttentionFactory:
    """Stands in for `Attention` in a family's module while its model is built."""

    def __init__(self, attention_cls, text_config, plans: dict[int, LayerPlan]):
        self.attention_cls = attention_cls
        self.signature = inspect.signature(attention_cls.__init__)
        self.kinds = layer_kinds(text_config)
        self.sliding_window = getattr(text_config, "sliding_window", None)
        self.plans = plans
        self.built: dict[int, object] = {}

    def __call__(self, *args, **kwargs):
        from vllm.model_executor.models.utils import extract_layer_index

        bound = self.signature.bind(None, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self", None)
        extra = arguments.pop("extra_impl_args", {}) or {}
        arguments.update(extra)
        prefix = arguments.get("prefix", "")
        layer = extract_layer_index(prefix)
        if self.kinds[layer] == "sliding_attention":
            arguments["per_layer_sliding_window"] = self.sliding_window
            return self.attention_cls(**arguments)
        plan = self.plans[layer]
        self.built[layer] = prefix
        if not plan.split:
            arguments["per_layer_sliding_window"] = plan.groups[0].window
            return self.attention_cls(**arguments)
        if arguments.get("alibi_slopes") is not None:
            raise PolicyError(f"layer {layer}: ALiBi slopes are per query head; headwise_vllm does not permute them")
        names = ("num_heads", "head_size", "scale", "num_kv_heads", "prefix", "per_layer_sliding_window", "sinks",
                 "head_size_v")
        fixed = {n: arguments.pop(n, None) for n in names}
        return HeadwiseSplitAttention(self.attention_cls, plan, num_heads=fixed["num_heads"],
                                      head_size=fixed["head_size"], scale=fixed["scale"],
                                      num_kv_heads=fixed["num_kv_heads"] or fixed["num_heads"],
                                      prefix=fixed["prefix"], sinks=fixed["sinks"], head_size_v=fixed["head_size_v"],
                                      **arguments)


def _patched_attention(module_name: str, factory_args):
    """The family's module-level `Attention` replaced by an _AttentionFactory while the block runs."""
    return vllm_internals.module_attention_replaced(module_name,
                                                    lambda original: _AttentionFactory(original, *factory_args))


@contextlib.contextmanager
def _qwen2_window_layers(text_config):
    # vLLM's Qwen2Model asserts max_window_layers == num_hidden_layers whenever layer_types mixes
    # kinds, because it cannot window only some layers; the factory does, so let it build.
    saved = getattr(text_config, "max_window_layers", None)
    if saved is not None and len(set(layer_kinds(text_config))) > 1:
        text_config.max_window_layers = text_config.num_hidden_layers
    try:
        yield
    finally:
        if saved is not None:
            text_config.max_window_layers = saved


class HeadwiseServing:
    """Mixin for a stock vLLM causal-LM class: builds it under the policy, permutes after loading."""

    _vllm_module = ""

    def __init__(self, *, vllm_config, prefix: str = ""):
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        path = os.environ.get(ENV_POLICY, "")
        if not path:  # no policy (now): the stock model
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self._headwise_policy, self._headwise_splits = None, []
            return
        policy = read_policy(path)
        text_config = vllm_config.model_config.hf_config.get_text_config()
        tp_rank, tp_size, pp_rank, pp_size = vllm_internals.parallel_ranks()
        plans = plan_model(policy, text_config, _model_dir(vllm_config), tp_size=tp_size, tp_rank=tp_rank)
        _check_engine(vllm_config, policy)
        # A pipeline stage builds its own layers only (the others are vLLM's PPMissingLayer).
        start, end = vllm_internals.pipeline_layer_range(text_config.num_hidden_layers, pp_rank, pp_size)
        with _patched_attention(self._vllm_module, (text_config, plans)) as factory, \
                _qwen2_window_layers(text_config):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        missing = sorted(l for l in set(plans) - set(factory.built) if start <= l < end)
        if missing:
            raise PolicyError(f"{policy.path}: the model built no attention layer for global layers {missing}")
        self._headwise_policy = policy
        self._headwise_splits = []
        for name, module in self.named_modules():
            split = getattr(module, "attn", None)
            if not isinstance(split, HeadwiseSplitAttention):
                continue
            for proj in ("qkv_proj", "o_proj"):
                method = getattr(getattr(module, proj, None), "quant_method", None)
                if not isinstance(method, UnquantizedLinearMethod):
                    raise PolicyError(f"{policy.path}: {name}.{proj} is quantized ({type(method).__name__}); "
                                      "headwise_vllm permutes unquantized attention weights only")
            self._headwise_splits.append((module, split))
        windows = {l: ["full" if w is FULL else w for w in ws] for l, ws in sorted(policy.windows.items())}
        where = "" if tp_size == pp_size == 1 else (
            f" (tensor-parallel rank {tp_rank} of {tp_size}: KV heads {_shard_names(plans)}; pipeline stage "
            f"{pp_rank} of {pp_size}: layers {start}-{end - 1})")
        logger.info("headwise_vllm: serving %s: %d global layers, %d split by window: %s%s", policy.path, len(plans),
                    len(self._headwise_splits), windows, where)

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        # The checkpoint arrives in its own head order; every load reorders it.
        for parent, split in self._headwise_splits:
            permute_layer_weights(parent, split)
        return loaded


def _shard_names(plans: dict[int, LayerPlan]) -> str:
    return ", ".join(f"layer {l} {['full' if w is FULL else w for w in p.windows]}" for l, p in sorted(plans.items()))


def _served(base_module: str, base_name: str, attention_module: str):
    base = getattr(importlib.import_module(base_module), base_name)
    cls = type(f"Headwise{base_name}", (HeadwiseServing, base), {"_vllm_module": attention_module,
                                                                   "__module__": __name__})
    return cls


_MODELS = "vllm.model_executor.models."
# Architecture name (config.json "architectures") -> (module of the stock class, its name, the
# module whose `Attention` the model's attention layers call: Qwen3.5 builds Qwen3-Next's).
ARCHITECTURES = {
    "Gemma3ForCausalLM": (_MODELS + "gemma3", "Gemma3ForCausalLM", _MODELS + "gemma3"),
    "Qwen3ForCausalLM": (_MODELS + "qwen3", "Qwen3ForCausalLM", _MODELS + "qwen3"),
    "LlamaForCausalLM": (_MODELS + "llama", "LlamaForCausalLM", _MODELS + "llama"),
    "GptOssForCausalLM": (_MODELS + "gpt_oss", "GptOssForCausalLM", _MODELS + "gpt_oss"),
    "Qwen3NextForCausalLM": (_MODELS + "qwen3_next", "Qwen3NextForCausalLM", _MODELS + "qwen3_next"),
    "Qwen3_5ForCausalLM": (_MODELS + "qwen3_5", "Qwen3_5ForCausalLM", _MODELS + "qwen3_next"),
    "Qwen3_5MoeForCausalLM": (_MODELS + "qwen3_5", "Qwen3_5MoeForCausalLM", _MODELS + "qwen3_next"),
}


def __getattr__(name: str):
    # headwise_vllm.models:HeadwiseGemma3ForCausalLM etc., built on first use.
    for arch, (module, base_name, attention_module) in ARCHITECTURES.items():
        if name == f"Headwise{base_name}":
            cls = _served(module, base_name, attention_module)
            globals()[name] = cls
            return cls
    raise AttributeError(name)
