#!/usr/bin/env python3
"""Concurrency under load: N long requests at once against a fixed KV pool, vLLM with and
without a headwise policy, in one run (tools/bench-vllm.sh --load).

Run with .venv-vllm/bin/python. Both engines run in this process, one after the other, with the
same settings, pool and prompts. Each gets all `--requests` at once (`--prompt-tokens` random
token ids each, `--gen-tokens` greedy tokens, ignore_eos) and vLLM schedules them as it does for
any client: it admits a request while the pool has blocks for its tokens so far, and preempts a
running one (recomputed later) when a step cannot get a block. Per engine, from vLLM's own
scheduler (its SchedulerStats after every schedule() call; preemptions counted where the
scheduler preempts, Scheduler._preempt_request):
  peak running    the most requests running in one step
  mean running    the mean over steps
  preemptions     requests pushed back to the queue for want of blocks
  wall s          the whole batch, submission to the last token
  output tok/s    requests x gen tokens / wall
and what vLLM and mem-estimate say before anything runs: bytes one max-length request reserves,
vLLM's maximum concurrency at max_model_len, and mem-estimate's bytes for the same settings
(`mem-estimate --engine vllm`, with --full-kv and with the policy), whose ratio is the predicted
gain in max-length requests. Prints a markdown table; --json-out writes everything.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler in this process

CPU_BLOCK_SIZE = 128  # the CPU backend's block size when none is asked


class SchedulerProbe:
    """Records vLLM's scheduler stats after each step and counts its preemptions."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.running, self.waiting, self.usage = [], [], []
        self.preemptions = 0
        schedule, preempt = scheduler.schedule, scheduler._preempt_request

        def probed_schedule(*a, **k):
            out = schedule(*a, **k)
            stats = scheduler.make_stats()
            if stats is not None and stats.num_running_reqs:
                self.running.append(stats.num_running_reqs)
                self.waiting.append(stats.num_waiting_reqs)
                self.usage.append(stats.kv_cache_usage)
            return out

        def counted_preempt(*a, **k):
            self.preemptions += 1
            return preempt(*a, **k)

        scheduler.schedule = probed_schedule
        scheduler._preempt_request = counted_preempt

    def summary(self) -> dict:
        steps = len(self.running)
        return {"steps": steps, "peak_running": max(self.running, default=0),
                "mean_running": sum(self.running) / steps if steps else 0.0, "preemptions": self.preemptions,
                "peak_kv_cache_usage": max(self.usage, default=0.0)}


def run_engine(check, args, policy, prompts):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine_args = check.parse_args(["--model", args.model, "--policy", policy, "--max-model-len",
                                    str(args.max_model_len), "--tokens", args.tokens_file, "--dtype", args.dtype,
                                    "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--enforce-eager"])
    llm = check.start_engine(engine_args, log_stats=True, kv_cache_memory_bytes=args.kv_cache_bytes,
                             max_num_seqs=args.requests)
    try:
        kv = check.kv_cache_report(llm)
        probe = SchedulerProbe(llm.llm_engine.engine_core.engine_core.scheduler)
        params = SamplingParams(max_tokens=args.gen_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == args.gen_tokens for o in outs)
    finally:
        check.close_engine(llm)
    return {"bytes_per_request": kv["bytes_per_request"], "max_concurrency": kv["max_concurrency"],
            "num_blocks": kv["num_blocks"], "kv_cache_groups": len(kv["kv_cache_groups"]),
            "mamba_ssm_cache_dtype": kv["mamba_ssm_cache_dtype"], "model_dtype": kv["model_dtype"],
            "wall_s": wall, "output_tok_s": args.requests * args.gen_tokens / wall, **probe.summary()}


def mem_estimate(args, source, state_dtype, kv_dtype) -> int:
    out = subprocess.run([args.cli, "mem-estimate", "--model", args.model, *source, "--engine", "vllm", "--json",
                          "--max-model-len", str(args.max_model_len), "--block-size", str(CPU_BLOCK_SIZE),
                          "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--kv-dtype", kv_dtype,
                          "--state-dtype", state_dtype], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["total_bytes"]


def print_table(args, table, predicted):
    print(f"{os.path.basename(args.model.rstrip('/'))}: {args.requests} requests of {args.prompt_tokens} + "
          f"{args.gen_tokens} tokens at once, KV pool {args.kv_cache_bytes / 2**20:.0f} MiB, max_model_len "
          f"{args.max_model_len}, max_num_batched_tokens {args.max_num_batched_tokens}, {args.dtype}, eager")
    print("| engine | KV bytes / max-length request | max concurrency (vLLM) | peak running | mean running | "
          "preemptions | wall s | output tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, t in (("vLLM", table["none"]), (f"vLLM + {os.path.basename(args.policy)}", table["policy"])):
        print(f"| {label} | {t['bytes_per_request']:,} | {t['max_concurrency']:.2f} | {t['peak_running']} | "
              f"{t['mean_running']:.2f} | {t['preemptions']} | {t['wall_s']:.1f} | {t['output_tok_s']:.1f} |")
    n, q = table["none"], table["policy"]
    print(f"| policy / none | {q['bytes_per_request'] / n['bytes_per_request']:.3f} | "
          f"{q['max_concurrency'] / n['max_concurrency']:.3f} | {q['peak_running'] / n['peak_running']:.2f} | "
          f"{q['mean_running'] / n['mean_running']:.2f} | | {q['wall_s'] / n['wall_s']:.2f} | "
          f"{q['output_tok_s'] / n['output_tok_s']:.2f} |")
    print(f"mem-estimate --engine vllm: {predicted['none']:,} B per max-length request without the policy, "
          f"{predicted['policy']:,} B with it: predicted max-concurrency ratio x{predicted['ratio']:.3f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--cli", required=True, help="headwise-calc (for mem-estimate)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=3072)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--kv-cache-bytes", type=int, required=True,
                   help="the KV pool (vLLM's kv_cache_memory_bytes, which VLLM_CPU_KVCACHE_SPACE sets in GiB)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokens-file", required=True, help="a prompt file for the engine's argument check")
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.prompt_tokens + args.gen_tokens > args.max_model_len:
        sys.exit(f"bench_vllm_load: --prompt-tokens + --gen-tokens exceed --max-model-len {args.max_model_len}")
    from headwise_vllm import check

    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    rng = random.Random(1)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
    table = {}
    for name, policy in (("none", "none"), ("policy", args.policy)):
        table[name] = run_engine(check, args, policy, prompts)
        print(f"{name}: {table[name]}", file=sys.stderr, flush=True)
    state = table["none"]["mamba_ssm_cache_dtype"]
    kv_dtype = table["none"]["model_dtype"]
    state = kv_dtype if state == "auto" else state
    predicted = {"none": mem_estimate(args, ["--full-kv"], state, kv_dtype),
                 "policy": mem_estimate(args, ["--config", args.policy], state, kv_dtype)}
    predicted["ratio"] = predicted["none"] / predicted["policy"]
    print_table(args, table, predicted)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"settings": vars(args), "engines": table, "mem_estimate": predicted}, f, indent=1)


if __name__ == "__main__":
    main()
