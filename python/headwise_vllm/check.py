"""Loads a model in vLLM with a policy (or without: --policy none) and prints what vLLM itself
reserves, how many max-length requests it admits and what it generates.

  python -m headwise_vllm.check --model DIR --policy P|none --max-model-len N --tokens ids.json [--json]

Everything is read from vLLM's own objects (the engine runs in this process,
VLLM_ENABLE_V1_MULTIPROCESSING=0): the scheduler's KV cache configuration (its groups, each
group's spec and layers, the pool's block count) and vLLM's own functions for a request's
reservation (KVCacheSpec.max_memory_usage_bytes, _max_memory_usage_bytes_from_groups) and the
maximum concurrency (get_max_concurrency_for_kv_cache_config). JSON keys:
  bytes_per_request   blocks per request summed over the groups x slots per group x page bytes
  kv_cache_groups     [{kind, window, layers, layer_ids, num_kv_heads, block_size, page_bytes,
                        blocks_per_request}]
  max_concurrency     vLLM's maximum concurrency for max-length requests
  tokens              vLLM's greedy continuation of the prompt (--new-tokens, default 8)
  block_size          the attention block size vLLM used (the CPU backend may change the one asked)
and more: num_blocks, pool_bytes, group_slots, page_bytes, max_num_batched_tokens, kv_cache_dtype,
vllm_max_memory_usage_bytes (vLLM's own sum, equal to bytes_per_request), timings. With
--tensor-parallel-size / --pipeline-parallel-size above 1 the workers run as processes (vLLM's mp
executor, each bound to one core) and the scheduler's configuration is one rank's: its groups,
pages and bytes are what each rank reserves (under tensor parallelism every rank's are equal). With
--logprobs-out FILE it also writes vLLM's log-probabilities over the whole vocabulary at every
prompt position and for each generated token (safetensors: prompt_logprobs [n-1, V],
generated_logprobs [new, V], tokens), for parity checks on small vocabularies.
Exit 1 with one line on bad input (a policy vLLM cannot serve included).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

from headwise_hf.policy import PolicyError, read_policy

from . import vllm_internals
from .plan import ENV_POLICY, check_servable, plan_model


class CheckError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m headwise_vllm.check", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model folder (config.json + safetensors)")
    p.add_argument("--policy", required=True, help="policy.yaml, or `none` to load the model without one")
    p.add_argument("--max-model-len", required=True, type=int, help="vLLM's max_model_len (tokens)")
    p.add_argument("--tokens", required=True, help="JSON file: a list of prompt token ids")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: a short table)")
    p.add_argument("--new-tokens", type=int, default=8, help="greedy tokens to generate (default 8)")
    p.add_argument("--block-size", type=int, help="vLLM's block_size (default: the backend's)")
    p.add_argument("--max-num-batched-tokens", type=int, help="vLLM's max_num_batched_tokens (default: vLLM's)")
    p.add_argument("--dtype", default="auto", help="vLLM's dtype (default auto: the checkpoint's)")
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile (faster start, slower steps)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.2,
                   help="vLLM's share of device memory (on CPU: of host memory; default 0.2)")
    p.add_argument("--logprobs-out", help="write full-vocabulary log-probabilities (safetensors)")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="vLLM's tensor_parallel_size (default 1); above 1 the workers are processes (mp)")
    p.add_argument("--pipeline-parallel-size", type=int, default=1,
                   help="vLLM's pipeline_parallel_size (default 1)")
    args = p.parse_args(argv)
    for flag, value in (("--max-model-len", args.max_model_len), ("--new-tokens", args.new_tokens),
                        ("--tensor-parallel-size", args.tensor_parallel_size),
                        ("--pipeline-parallel-size", args.pipeline_parallel_size)):
        if value <= 0:
            raise CheckError(f"{flag}: must be positive, got {value}")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise CheckError(f"--model {args.model}: no config.json there")
    return args


def read_tokens(path: str, max_model_len: int, new_tokens: int) -> list[int]:
    try:
        with open(path, encoding="utf-8") as f:
            ids = json.load(f)
    except OSError as e:
        raise CheckError(f"--tokens {path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise CheckError(f"--tokens {path}: not JSON ({e.msg})") from None
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in ids):
        raise CheckError(f"--tokens {path}: expected a non-empty list of token ids")
    if len(ids) + new_tokens > max_model_len:
        raise CheckError(f"--tokens {path}: {len(ids)} tokens + {new_tokens} new exceed --max-model-len {max_model_len}")
    return ids


def _spec_kind(spec) -> str:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    if isinstance(spec, SlidingWindowSpec):
        return "sliding_window"
    if isinstance(spec, FullAttentionSpec):
        return "full_attention"
    if isinstance(spec, MambaSpec):
        return "mamba"
    return type(spec).__name__


def kv_cache_report(llm) -> dict:
    """vLLM's KV cache configuration as its scheduler holds it."""
    from vllm.model_executor.models.utils import extract_layer_index
    from vllm.v1.core import kv_cache_utils as kcu

    vllm_config = llm.llm_engine.vllm_config
    config = vllm_internals.engine_scheduler(llm).kv_cache_config
    groups = []
    for g in config.kv_cache_groups:
        spec = g.kv_cache_spec
        blocks = math.ceil(spec.max_memory_usage_bytes(vllm_config) / spec.page_size_bytes)
        groups.append({
            "kind": _spec_kind(spec),
            "window": getattr(spec, "sliding_window", None),
            "layers": list(g.layer_names),
            "layer_ids": [extract_layer_index(n) for n in g.layer_names],
            "num_kv_heads": getattr(spec, "num_kv_heads", None),
            "block_size": spec.block_size,
            "page_bytes": spec.page_size_bytes,
            "blocks_per_request": blocks,
        })
    pages = {g["page_bytes"] for g in groups}
    if len(pages) > 1:
        raise CheckError(f"vLLM's groups have several page sizes ({sorted(pages)}); bytes_per_request assumes one")
    slots = max((len(g["layers"]) for g in groups), default=0)
    page = pages.pop() if pages else 0
    bytes_per_request = sum(g["blocks_per_request"] for g in groups) * slots * page
    return {
        "kv_cache_groups": groups,
        "group_slots": slots,
        "page_bytes": page,
        "bytes_per_request": bytes_per_request,
        "vllm_max_memory_usage_bytes": vllm_internals.max_memory_usage_bytes_from_groups(vllm_config,
                                                                                      config.kv_cache_groups),
        "num_blocks": config.num_blocks,
        "pool_bytes": config.num_blocks * slots * page,
        "max_concurrency": kcu.get_max_concurrency_for_kv_cache_config(vllm_config, config),
        "block_size": vllm_config.cache_config.block_size,
        "tensor_parallel_size": vllm_config.parallel_config.tensor_parallel_size,
        "pipeline_parallel_size": vllm_config.parallel_config.pipeline_parallel_size,
        "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
        "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
        # The state dtypes vLLM resolved (the CPU backend resets the SSM state to float32).
        "mamba_cache_dtype": str(vllm_config.cache_config.mamba_cache_dtype),
        "mamba_ssm_cache_dtype": str(vllm_config.cache_config.mamba_ssm_cache_dtype),
        "model_dtype": str(vllm_config.model_config.dtype).replace("torch.", ""),
    }


def generate(llm, ids: list[int], new_tokens: int, logprobs_out: str | None) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    full = logprobs_out is not None
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, detokenize=False,
                            logprobs=vocab if full else None, prompt_logprobs=vocab if full else None)
    t0 = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    seconds = time.perf_counter() - t0
    tokens = list(out.outputs[0].token_ids)
    if full:
        write_logprobs(logprobs_out, out, tokens, vocab)
    return {"tokens": tokens, "generate_seconds": seconds}


def write_logprobs(path: str, out, tokens: list[int], vocab: int) -> None:
    import torch
    from safetensors.torch import save_file

    def dense(entries) -> torch.Tensor:
        rows = torch.full((len(entries), vocab), float("-inf"), dtype=torch.float32)
        for i, entry in enumerate(entries):
            for token, lp in entry.items():
                rows[i, token] = lp.logprob
        return rows

    prompt = [e for e in out.prompt_logprobs if e is not None]  # position 0 has none
    tensors = {"prompt_logprobs": dense(prompt), "generated_logprobs": dense(out.outputs[0].logprobs),
               "tokens": torch.tensor(tokens, dtype=torch.long)}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def preflight(policy, model_dir: str, tp_size: int = 1) -> None:
    """What the plugin will refuse, checked before vLLM starts: one line instead of vLLM's traces."""
    from transformers import AutoConfig

    check_servable(policy)
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        raise CheckError(f"--model {model_dir}: transformers cannot read its config.json ({e})") from None
    plan_model(policy, config.get_text_config(decoder=True), model_dir, tp_size=tp_size)


def start_engine(args, log_stats: bool = False, **engine_kwargs):
    """vLLM's LLM for args.model under args.policy (`none`: without), in this process;
    log_stats: vLLM's per-request timestamps in each output's metrics and its scheduler stats;
    engine_kwargs: more of vLLM's engine arguments (e.g. kv_cache_memory_bytes)."""
    if args.policy == "none":
        os.environ.pop(ENV_POLICY, None)
    else:
        preflight(read_policy(args.policy), args.model, args.tensor_parallel_size)
        os.environ[ENV_POLICY] = os.path.abspath(args.policy)
    # The engine in this process: its scheduler (and so the KV cache config) is reachable.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from .plugin import install

    if args.policy != "none":
        install()  # as the entry point does; also when an earlier engine here had no policy
    kwargs = dict(model=args.model, skip_tokenizer_init=True, max_model_len=args.max_model_len, dtype=args.dtype,
                  enforce_eager=args.enforce_eager, gpu_memory_utilization=args.gpu_memory_utilization,
                  enable_prefix_caching=False, seed=0, disable_log_stats=not log_stats)
    if args.block_size:
        kwargs["block_size"] = args.block_size
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.logprobs_out:
        kwargs["max_logprobs"] = -1
    workers = args.tensor_parallel_size * args.pipeline_parallel_size
    if workers > 1:
        # One worker process per rank; vLLM's CPU workers each bind their OpenMP threads to the
        # cores VLLM_CPU_OMP_THREADS_BIND lists ("0|1": one core each), else it looks for a NUMA
        # node per worker and refuses ("Not enough allowed NUMA nodes").
        kwargs.update(tensor_parallel_size=args.tensor_parallel_size,
                      pipeline_parallel_size=args.pipeline_parallel_size, distributed_executor_backend="mp")
        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") == "auto":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1)) for i in range(workers))
    elif "|" in os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""):
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]  # set for an earlier multi-worker engine here
    return LLM(**kwargs, **engine_kwargs)


def close_engine(llm) -> None:
    """Shuts the in-process engine down so another can start in this process."""
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def run(args) -> dict:
    return run_prompts(args, [args.tokens], [args.logprobs_out] if args.logprobs_out else None)[0]


def run_prompts(args, tokens_paths: list[str], logprobs_paths: list[str] | None = None) -> list[dict]:
    """The report for each prompt file, from one engine (args.model under args.policy) that serves
    them one after another, as a server serves requests; every file is read before the engine
    starts. logprobs_paths: one file per prompt for its full-vocabulary log-probabilities, or None."""
    prompts = [read_tokens(path, args.max_model_len, args.new_tokens) for path in tokens_paths]
    vllm_internals.require_tested()  # the report reads vLLM internals, with or without a policy
    engine_args = argparse.Namespace(**vars(args))
    engine_args.logprobs_out = logprobs_paths[0] if logprobs_paths else None  # the engine keeps them
    t0 = time.perf_counter()
    llm = start_engine(engine_args)
    startup = time.perf_counter() - t0
    try:
        kv_cache = kv_cache_report(llm)
        return [{"model": args.model, "policy": args.policy, "max_model_len": args.max_model_len,
                 "prompt_tokens": len(ids), **kv_cache,
                 **generate(llm, ids, args.new_tokens, logprobs_paths[i] if logprobs_paths else None),
                 "startup_seconds": startup}
                for i, ids in enumerate(prompts)]
    finally:
        close_engine(llm)


def print_table(r: dict) -> None:
    print(f"{r['model']} under {r['policy']}: max_model_len {r['max_model_len']}, block {r['block_size']}, "
          f"KV {r['kv_cache_dtype']}")
    print(f"  {'kind':<15} {'window':>7} {'heads':>5} {'block':>6} {'page B':>9} {'blocks/req':>10}  layers")
    for g in r["kv_cache_groups"]:
        print(f"  {g['kind']:<15} {str(g['window'] or '-'):>7} {str(g['num_kv_heads']):>5} {g['block_size']:>6} "
              f"{g['page_bytes']:>9} {g['blocks_per_request']:>10}  {', '.join(g['layers'])}")
    print(f"  bytes per request {r['bytes_per_request']}, max concurrency {r['max_concurrency']:.2f} "
          f"({r['num_blocks']} blocks), tokens {r['tokens']}")


def main(argv=None) -> int:
    # vLLM logs to stdout by default (configured when vllm is first imported); stdout is the report.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        args = parse_args(argv)
        report = run(args)
    except (CheckError, PolicyError) as e:
        print(f"headwise_vllm.check: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
