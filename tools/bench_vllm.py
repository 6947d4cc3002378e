#!/usr/bin/env python3
"""vLLM with and without a headwise policy on one model, side by side in one run (tools/bench-vllm.sh).

Run with .venv-vllm/bin/python. Both engines run in this process, one after the other, `--rounds`
times alternately (none, policy, none, policy, ...), each with the same settings and the same
prompts, so the ratio compares like with like on a noisy machine. Per engine:
  prefill tok/s   `--prefill-requests` prompts of `--prompt-tokens` tokens, 1 new token each
  decode tok/s    `--decode-requests` prompts of 256 tokens decoded together, `--decode-tokens` new
                  tokens each: the tokens after each request's first over the median request's
                  time from its first to its last token (vLLM's own request timestamps)
  KV bytes        what vLLM reserves for one max-length request (its KV cache configuration)
  concurrency     vLLM's maximum concurrency for max-length requests in the KV pool
Rates: the median and the best over rounds x `--reps` (on a shared machine the best is the rate
least disturbed by other work; both are printed). Prints a markdown table; --json-out writes all.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def measure(llm, prompts, new_tokens):
    """Wall seconds for the batch, and each request's decode seconds (first to last token, from
    vLLM's own request timestamps)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    assert all(len(o.outputs[0].token_ids) == new_tokens for o in outs)
    decode = [o.metrics.last_token_ts - o.metrics.first_token_ts for o in outs] if new_tokens > 1 else []
    return seconds, decode


def run_engine(check, args, policy, prefill_prompts, decode_prompts):
    engine_args = check.parse_args(["--model", args.model, "--policy", policy, "--max-model-len",
                                    str(args.max_model_len), "--tokens", args.tokens_file, "--dtype", args.dtype,
                                    "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
                                   + ([] if args.compile else ["--enforce-eager"]))
    llm = check.start_engine(engine_args, log_stats=True)
    try:
        kv = check.kv_cache_report(llm)
        measure(llm, decode_prompts[:1], 2)  # warm-up, not timed
        rows = []
        for _ in range(args.reps):
            prefill, _ = measure(llm, prefill_prompts, 1)
            _, decode = measure(llm, decode_prompts, args.decode_tokens)
            rows.append({
                "prefill_tok_s": sum(map(len, prefill_prompts)) / prefill,
                # the batch's decode rate: every request's tokens after its first over the median
                # request's decode time
                "decode_tok_s": len(decode_prompts) * (args.decode_tokens - 1) / statistics.median(decode),
            })
    finally:
        check.close_engine(llm)
    return kv, rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt-tokens", type=int, default=4096)
    p.add_argument("--prefill-requests", type=int, default=2)
    p.add_argument("--decode-requests", type=int, default=8)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="measurements per engine and round")
    p.add_argument("--compile", action="store_true", help="torch.compile (default: eager, as the tests run)")
    p.add_argument("--json-out")
    p.add_argument("--tokens-file", required=True, help="a prompt file for the engine's argument check")
    args = p.parse_args()
    from headwise_vllm import check

    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    rng = random.Random(1)
    prefill_prompts = [[rng.randrange(vocab) for _ in range(args.prompt_tokens)] for _ in range(args.prefill_requests)]
    decode_prompts = [[rng.randrange(vocab) for _ in range(256)] for _ in range(args.decode_requests)]
    results = {"none": {"rows": []}, "policy": {"rows": []}}
    for r in range(args.rounds):
        for name, policy in (("none", "none"), ("policy", args.policy)):
            kv, rows = run_engine(check, args, policy, prefill_prompts, decode_prompts)
            results[name]["kv"] = kv
            results[name]["rows"] += rows
            print(f"round {r}: {name}: {rows}", file=sys.stderr, flush=True)
    table = {}
    for name, res in results.items():
        kv = res["kv"]
        rows = res["rows"]
        table[name] = {
            "bytes_per_request": kv["bytes_per_request"],
            "max_concurrency": kv["max_concurrency"],
            "kv_cache_groups": len(kv["kv_cache_groups"]),
            "block_size": kv["block_size"],
            "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in rows),
            "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rows),
            "best_prefill_tok_s": max(r["prefill_tok_s"] for r in rows),
            "best_decode_tok_s": max(r["decode_tok_s"] for r in rows),
            "runs": rows,
        }
    n, q = table["none"], table["policy"]
    print(f"{args.model}: max_model_len {args.max_model_len}, max_num_batched_tokens {args.max_num_batched_tokens}, "
          f"{args.dtype}, {'compiled' if args.compile else 'eager'}, {args.rounds} rounds x {args.reps} reps per "
          f"engine; tok/s as median (best)")
    print("| engine | KV groups | KV bytes / request | max concurrency | prefill tok/s | decode tok/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, t in (("vLLM", n), (f"vLLM + {os.path.basename(args.policy)}", q)):
        print(f"| {label} | {t['kv_cache_groups']} | {t['bytes_per_request']:,} | {t['max_concurrency']:.2f} | "
              f"{t['prefill_tok_s']:.0f} ({t['best_prefill_tok_s']:.0f}) | "
              f"{t['decode_tok_s']:.1f} ({t['best_decode_tok_s']:.1f}) |")
    keys = ("bytes_per_request", "max_concurrency", "prefill_tok_s", "decode_tok_s", "best_prefill_tok_s",
            "best_decode_tok_s")
    ratio = {k: q[k] / n[k] for k in keys}
    print(f"| policy / none | | {ratio['bytes_per_request']:.3f} | {ratio['max_concurrency']:.3f} | "
          f"{ratio['prefill_tok_s']:.2f} ({ratio['best_prefill_tok_s']:.2f}) | "
          f"{ratio['decode_tok_s']:.2f} ({ratio['best_decode_tok_s']:.2f}) |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"settings": vars(args), "engines": table, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
