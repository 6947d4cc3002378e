"""The vLLM general plugin (entry point `vllm.general_plugins`: headwise).

vLLM calls register() in every process it starts. Without HEADWISE_POLICY it does nothing: vLLM
runs unchanged. With HEADWISE_POLICY=path/to/policy.yaml it reads the policy, refuses what vLLM
cannot serve (h2o keep rules, sink tokens) before anything loads, and installs: the served
classes of models.py registered under the stock architecture names, so `vllm serve` / `LLM(...)`
build them, and a check that refuses any other architecture while a policy is set (serving it
without the policy would be silent). The served classes read HEADWISE_POLICY when a model is
built; with it unset they are the stock classes, so one process may start engines with and
without a policy (headwise_vllm.check does).
"""
from __future__ import annotations

import functools
import os

from headwise_hf.policy import read_policy

from .plan import ENV_POLICY, check_servable

# Multimodal wrappers whose language model vLLM resolves through the registry to a served class.
WRAPPER_ARCHITECTURES = ("Gemma3ForConditionalGeneration",)

_registered = False


def _served_architectures():
    from .models import ARCHITECTURES

    return set(ARCHITECTURES) | set(WRAPPER_ARCHITECTURES)


def _refuse_unserved(method):
    @functools.wraps(method)
    def wrapper(self, architectures, *args, **kwargs):
        result = method(self, architectures, *args, **kwargs)
        arch = result[1]
        if os.environ.get(ENV_POLICY) and arch not in _served_architectures():
            from headwise_hf.policy import PolicyError

            why = (" (a gated-DeltaNet hybrid: docs/deploy.md says where its policies run)"
                   if arch.startswith(("Qwen3Next", "Qwen3_5")) else "")
            raise PolicyError(f"{ENV_POLICY}={os.environ.get(ENV_POLICY)}: architecture {arch} is not one headwise_vllm "
                              f"serves ({', '.join(sorted(_served_architectures()))}){why}; unset {ENV_POLICY} to "
                              "serve the model without the policy")
        return result

    wrapper._headwise_wrapped = True
    return wrapper


def register() -> None:
    """The entry point: installs when HEADWISE_POLICY is set."""
    path = os.environ.get(ENV_POLICY, "")
    if path:
        check_servable(read_policy(path))  # PolicyError names the file and the field
        install()


def install() -> None:
    """Registers the served classes and the architecture check (once per process)."""
    global _registered
    if _registered:
        return
    from vllm import ModelRegistry
    from vllm.model_executor.models.registry import _ModelRegistry

    from . import models

    # Classes, not "module:Class" strings: a lazily registered class is inspected in a fresh
    # subprocess that imports vLLM again (a minute on a busy 2-core machine, per architecture,
    # until its cache entry exists); these import only the four stock model modules.
    for arch, (_, base_name) in models.ARCHITECTURES.items():
        ModelRegistry.register_model(arch, getattr(models, f"Headwise{base_name}"))
    # vLLM caches each model folder's resolved class; an engine built here before the policy was
    # set (headwise_vllm.check starts several) must not hand the next one the stock class.
    from vllm.model_executor.model_loader import utils as loader_utils

    loader_utils._MODEL_ARCH_BY_HASH.clear()
    for name in ("resolve_model_cls", "inspect_model_cls"):
        method = getattr(_ModelRegistry, name)
        if not getattr(method, "_headwise_wrapped", False):
            setattr(_ModelRegistry, name, _refuse_unserved(method))
    _registered = True
