"""headwise policies served in vLLM: per-window head groups as vLLM attention layers.

Set HEADWISE_POLICY=path/to/policy.yaml and start vLLM as usual (`vllm serve`, `LLM(...)`); the
plugin (entry point `vllm.general_plugins`: headwise, installed with python/) splits every global
attention layer into one attention layer per window of its KV heads, so vLLM's hybrid KV cache
manager pages each group for its window. `python -m headwise_vllm.check` loads a model with and
without a policy and prints vLLM's own KV cache configuration. See docs/deploy.md.
"""
from headwise_hf import __version__  # one version number: headwise_hf's

from .plan import ENV_POLICY, SERVED_MODEL_TYPES, HeadGroup, LayerPlan, check_servable, plan_layer, plan_model

__all__ = ["__version__", "ENV_POLICY", "SERVED_MODEL_TYPES", "HeadGroup", "LayerPlan", "check_servable", "plan_layer",
           "plan_model"]
