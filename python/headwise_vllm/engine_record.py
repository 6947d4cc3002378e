"""The engine a policy was calibrated for (`headwise-calc ... --engine vllm` writes
`engine: {name: vllm, max_num_batched_tokens, ...}` into policy.yaml) against the engine serving it.

A policy calibrated in vLLM's bytes holds its budget at the parameters it was calibrated with:
max_num_batched_tokens (a sliding group reserves its window plus that many tokens), the block size,
max_model_len (the policy's context), the KV dtype. notice() says in one line which differ; the plugin logs it
once vLLM has built its configuration, headwise_vllm.check prints it. Nothing is refused: the
policy serves the same, only its bytes are not the calibrated ones.
"""
from __future__ import annotations

import os
from typing import Optional

import yaml


def recorded_engine(policy_path: str) -> Optional[dict]:
    """The policy's `engine` record, or None (a policy calibrated for headwise's own cache)."""
    try:
        with open(os.fspath(policy_path), encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None  # read_policy reports what is wrong with the file
    engine = doc.get("engine") if isinstance(doc, dict) else None
    if not isinstance(engine, dict) or engine.get("name") != "vllm":
        return None
    return {**engine, "block_size": doc.get("block_size"), "context": doc.get("context"), "dtype": doc.get("dtype")}


def notice(policy_path: str, *, max_num_batched_tokens: Optional[int], block_size: Optional[int],
           max_model_len: Optional[int], kv_dtype: Optional[str] = None) -> Optional[str]:
    """One line when vLLM runs `policy_path` with other parameters than it was calibrated for."""
    engine = recorded_engine(policy_path)
    if engine is None:
        return None
    calibrated, now = [], []

    def compare(name, at_calibration, serving, also=()):
        if serving is None or at_calibration is None or serving == at_calibration or serving in also:
            return
        calibrated.append(f"{name} {at_calibration}")
        now.append(f"{name} {serving}")

    compare("max_num_batched_tokens", engine.get("max_num_batched_tokens"), max_num_batched_tokens)
    # vLLM may grow the attention block of a hybrid model to hold a state page: that block counts too.
    compare("block_size", engine.get("block_size"), block_size, (engine.get("attention_block_size"),))
    compare("max_model_len", engine.get("context"), max_model_len)
    compare("kv_dtype", engine.get("dtype"), kv_dtype)
    if not calibrated:
        return None
    return (f"headwise_vllm: {policy_path} was calibrated for vLLM at {', '.join(calibrated)}; this engine runs "
            f"{', '.join(now)}: its budget ({engine.get('total_bytes')} B in vLLM's reservation) holds at its "
            "own parameters only (headwise-calc mem-estimate --config POLICY --max-num-batched-tokens N "
            "--block-size B --max-model-len L gives the bytes at others)")


def notice_for_config(policy_path: str, vllm_config) -> Optional[str]:
    """notice() for a VllmConfig (what LLM(...) and the server build)."""
    return notice(policy_path,
                  max_num_batched_tokens=getattr(vllm_config.scheduler_config, "max_num_batched_tokens", None),
                  block_size=getattr(vllm_config.cache_config, "block_size", None),
                  max_model_len=getattr(vllm_config.model_config, "max_model_len", None),
                  kv_dtype=_kv_dtype(vllm_config))


def _kv_dtype(vllm_config) -> Optional[str]:
    """The KV cache's dtype as a policy spells it: cache_dtype, or the model's dtype for `auto`
    (on CPU vLLM runs a float32 checkpoint in bfloat16 unless --dtype says otherwise)."""
    cache = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    if cache != "auto":
        return cache
    dtype = getattr(vllm_config.model_config, "dtype", None)
    return None if dtype is None else str(dtype).replace("torch.", "")
