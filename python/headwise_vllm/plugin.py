"""The vLLM general plugin (entry point `vllm.general_plugins`: headwise).

vLLM calls register() in every process it starts. Without HEADWISE_POLICY it does nothing: vLLM
runs unchanged. With HEADWISE_POLICY=path/to/policy.yaml it reads the policy, refuses what vLLM
cannot serve (h2o keep rules, sink tokens) before anything loads, and installs: the served
classes of models.py registered under the stock architecture names, so the server and `LLM(...)`
build them, and a check, run where vLLM resolves the model's architecture (in the server's own
process, before the engine starts), that refuses any other architecture while a policy is set
(serving it without the policy would be silent) and a policy whose model, layers or head counts
are not this model's; and, once vLLM has built its configuration in the front-end process, a
policy whose KV heads do not shard evenly over the tensor-parallel ranks. A refusal stops the
process with one line naming the policy file and its field (PolicyRefused), not a trace through vLLM's start-up; so does a vLLM other than the
tested one (vllm_internals.UntestedVllm: every private part of vLLM used here is read through
vllm_internals). The served classes read HEADWISE_POLICY when a model is built; with it unset
they are the stock classes, so one process may start engines with and without a policy
(headwise_vllm.check does).
"""
from __future__ import annotations

import functools
import logging
import os

from headwise_hf.policy import PolicyError, read_policy

from . import engine_record
from .plan import ENV_POLICY, check_servable, check_shards, plan_model

# Multimodal wrappers whose language model vLLM resolves through the registry to a served class.
WRAPPER_ARCHITECTURES = ("Gemma3ForConditionalGeneration",)


class PolicyRefused(SystemExit):
    """HEADWISE_POLICY names a policy vLLM cannot serve here. A SystemExit: uncaught, Python prints
    the one-line message and exits with status 1, before any weights load; vLLM's start-up code
    catches Exception in places and would otherwise print a trace several screens long."""

    def __init__(self, error: PolicyError):
        super().__init__(f"headwise_vllm: {error}")
        self.error = error


def refuse_on_error(fn):
    """Runs fn; a PolicyError becomes PolicyRefused."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PolicyError as e:
            raise PolicyRefused(e) from None

    return wrapper


_registered = False


def _served_architectures():
    from .models import ARCHITECTURES

    return set(ARCHITECTURES) | set(WRAPPER_ARCHITECTURES)


# (policy path, its mtime, model path) already checked in this process: vLLM resolves the
# architecture several times per engine.
_checked: set = set()


def check_model(path: str, arch: str, model_config) -> None:
    """The policy against the model vLLM is about to build: its architecture, fingerprint, global
    layers and KV head counts. Raises PolicyError naming the file and field."""
    if arch not in _served_architectures():
        why = (" (a multimodal wrapper whose language model headwise_vllm does not build)"
               if arch.endswith("ForConditionalGeneration") else "")
        raise PolicyError(f"{ENV_POLICY}={path}: architecture {arch} is not one headwise_vllm serves "
                          f"({', '.join(sorted(_served_architectures()))}){why}; unset {ENV_POLICY} to "
                          "serve the model without the policy")
    model = getattr(model_config, "model", None)
    key = (path, os.stat(path).st_mtime_ns if os.path.exists(path) else None, model)
    if arch in WRAPPER_ARCHITECTURES or key in _checked:
        return
    model_dir = model if model and os.path.isdir(model) else None
    plan_model(read_policy(path), model_config.hf_config.get_text_config(), model_dir)
    _checked.add(key)


def check_parallel(path: str, vllm_config) -> None:
    """The policy against the engine's parallel sizes, in the front-end process once vLLM has built
    its configuration (before any worker starts or weight loads): under tensor parallelism every
    rank's shard of every global layer must hold the same windows. Pipeline parallelism splits the
    layers and needs nothing per head. Raises PolicyError naming the file and field."""
    tp = vllm_config.parallel_config.tensor_parallel_size
    if tp == 1:
        return
    text_config = vllm_config.model_config.hf_config.get_text_config()
    check_shards(read_policy(path), tp, getattr(text_config, "num_attention_heads", None))


def _check_parallel_after(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        vllm_config = method(self, *args, **kwargs)
        path = os.environ.get(ENV_POLICY)
        if path:
            refuse_on_error(check_parallel)(path, vllm_config)
            # A policy calibrated for vLLM (--engine vllm) served at other parameters: one line.
            line = engine_record.notice_for_config(path, vllm_config)
            if line:
                logging.getLogger("vllm.headwise_vllm").warning("%s", line)
        return vllm_config

    return wrapper


def _refuse_unserved(method):
    @functools.wraps(method)
    def wrapper(self, architectures, *args, **kwargs):
        result = method(self, architectures, *args, **kwargs)
        path = os.environ.get(ENV_POLICY)
        model_config = args[0] if args else kwargs.get("model_config")
        if path:
            refuse_on_error(check_model)(path, result[1], model_config)
        return result

    wrapper._headwise_wrapped = True
    return wrapper


def register() -> None:
    """The entry point: installs when HEADWISE_POLICY is set."""
    path = os.environ.get(ENV_POLICY, "")
    if path:
        refuse_on_error(lambda: check_servable(read_policy(path)))()  # one line naming the file and field
        install()


def install() -> None:
    """Registers the served classes and the architecture check (once per process)."""
    global _registered
    from . import vllm_internals

    vllm_internals.require_tested()  # an untested vLLM: one line, before anything is patched
    if _registered:
        return
    from vllm import ModelRegistry

    from . import models

    # Classes, not "module:Class" strings: a lazily registered class is inspected in a fresh
    # subprocess that imports vLLM again (a minute on a busy 2-core machine, per architecture,
    # until its cache entry exists); these import only the served families' stock modules.
    for arch, (_, base_name, _) in models.ARCHITECTURES.items():
        ModelRegistry.register_model(arch, getattr(models, f"Headwise{base_name}"))
    # vLLM caches each model folder's resolved class; an engine built here before the policy was
    # set (headwise_vllm.check starts several) must not hand the next one the stock class.
    vllm_internals.forget_resolved_architectures()
    registry = vllm_internals.model_registry_class()
    for name in ("resolve_model_cls", "inspect_model_cls"):
        method = getattr(registry, name)
        if not getattr(method, "_headwise_wrapped", False):
            setattr(registry, name, _refuse_unserved(method))
    vllm_internals.wrap_engine_config(_check_parallel_after)
    _registered = True
