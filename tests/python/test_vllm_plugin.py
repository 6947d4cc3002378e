#!/usr/bin/env python3
"""python/headwise_vllm in vLLM itself, against headwise's runtime decoder and mem-estimate.

Run with .venv-vllm/bin/python (tools/setup.sh --vllm). Every engine runs in this one process
(headwise_vllm.check.run, engines one after another): vLLM's import costs more than an engine.

  1. Parity. For the gemma3, qwen3 (sliding layers from layer_types), llama and gpt-oss fixtures,
     each under a policy whose global layers mix windows (64/256/1024/full), vLLM's
     log-probabilities over the whole vocabulary at every prompt position and for 8 greedy tokens
     equal those of `headwise-calc forward --policy` (same windows) within 1e-3, on prompts of
     1.2K and 4K tokens, chunked by vLLM (max_num_batched_tokens 256); the greedy tokens are the
     decoder's argmax; the policy changes the logits (> 1e-2 from full KV), so the comparison
     shows the windows. vLLM exposes log-probabilities, not raw logits; headwise's logits are
     compared after the same log-softmax.
  2. Bytes. vLLM's own KV cache configuration under each policy (groups: kind, window, KV heads,
     block size, page bytes, blocks per request, layers) equals `mem-estimate --engine vllm` at
     vLLM's block size, max_num_batched_tokens and KV dtype, and so does the request's total;
     without a policy, vLLM's configuration equals `mem-estimate --full-kv --engine vllm`. With a
     fixed VLLM_CPU_KVCACHE_SPACE, vLLM's maximum concurrency is what mem-estimate's bytes give
     in that pool, with and without the policy, so it grows by mem-estimate's ratio. The engine
     without a policy runs first: the plugin must take over in a process that built the stock
     class already.
  3. Refusals: a policy with h2o heads (one line naming --keep-rules window, from the check tool
     and from the plugin's entry point), sink tokens, another model's policy, a model family the
     plugin does not serve.

Usage: test_vllm_plugin.py --cli build/bin/headwise-calc [--fixtures tests/fixtures] [--venv .venv-vllm]
(started by another python, it re-runs itself under the venv's). Exit 0 on success, 1 on failure, 4 (ctest's SKIP_RETURN_CODE) when vLLM cannot be imported, unless
HEADWISE_REQUIRE_VLLM=1 (tools/test.sh sets it: CI installs the environment, so it must run).
"""
import argparse
import hashlib
import json
import os
import pathlib
import random
import subprocess
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

reexec_in_venv()
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(KV_SPACE_GIB)
try:
    import torch
    import vllm  # noqa: F401
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "python"))
    from headwise_hf.policy import PolicyError, read_policy
    from headwise_vllm import check, plan_layer, plan_model
    from headwise_vllm.plugin import register
except ImportError as e:
    if os.environ.get("HEADWISE_REQUIRE_VLLM") == "1":
        print(f"FAIL vLLM environment required (HEADWISE_REQUIRE_VLLM=1) but not importable: {e}")
        sys.exit(1)
    print(f"SKIP: {e} (tools/setup.sh --vllm creates .venv-vllm)")
    sys.exit(4)

ok = Checklist()


def run(cmd, expect_ok=True, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    if expect_ok and r.returncode != 0:
        raise SystemExit(f"FAIL {' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r


def write_policy(path, fixture_dir, windows, *, rules=None, sinks=0, context=MAX_MODEL_LEN):
    name = lambda w: "full" if w is None else str(w)  # noqa: E731
    sha = hashlib.sha256((fixture_dir / "config.json").read_bytes()).hexdigest()
    lines = ["schema: headwise/policy/v1", f'model_name: "{fixture_dir.name}"', f'model_path: "{fixture_dir}"',
             "model_fingerprint:", f"  config_sha256: {sha}", "budget_gb: 0", f"context: {context}", "batch: 1",
             "dtype: float32", "block_size: 16", f"sink_tokens: {sinks}", "window_levels: [64, 256, 1024, full]",
             "per_layer_policies:"]
    for layer, heads in sorted(windows.items()):
        lines += [f"  - layer_id: {layer}", f"    kv_head_windows: [{', '.join(name(w) for w in heads)}]"]
        if rules and layer in rules:
            lines += [f"    kv_head_rules: [{', '.join(rules[layer])}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def model_view(fixture_dir, tmp):
    """vLLM loads every *.safetensors of a folder; the fixtures also hold reference.safetensors."""
    view = tmp / "models" / fixture_dir.name
    view.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (fixture_dir / name).exists() and not (view / name).exists():
            (view / name).symlink_to(fixture_dir / name)
    return view


# Mixed windows in every global layer (checkpoint head order); 4 KV heads per layer.
POLICIES = {
    "gemma3_vllm": {1: [64, 256, None, 64], 3: [256, None, None, 1024]},
    "qwen3_sliding_vllm": {0: [1024, 64, None, 256], 1: [None, 64, 64, 256]},
    # layer 2 keeps one window (not split), layer 3 is full KV (not split)
    "llama_vllm": {0: [64, 256, None, 64], 1: [256, None, None, 1024], 2: [64, 64, 64, 64], 3: [None] * 4},
    "gpt_oss_vllm": {1: [64, 256, None, 64], 3: [None, 1024, 256, 64]},
}


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
    except PolicyError as e:
        ok("--keep-rules window" in str(e), f"the plugin's entry point refuses an h2o policy: {e}")
    finally:
        del os.environ["HEADWISE_POLICY"]
    sinks = write_policy(tmp / "sinks.yaml", g, POLICIES["gemma3_vllm"], sinks=4)
    r = run([sys.executable, "-m", "headwise_vllm.check", "--model", g, "--policy", sinks, "--max-model-len", 4096,
             "--tokens", ids], expect_ok=False)
    ok(r.returncode == 1 and "sink_tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
       f"sink tokens refused: {r.stderr.strip()}")
    qnext = fixtures / "qwen3_next_tiny"
    qnext_policy = write_policy(tmp / "qnext.yaml", qnext, {1: [8, 8], 3: [8, None]}, context=256)
    r = run([sys.executable, "-m", "headwise_vllm.check", "--model", qnext, "--policy", qnext_policy,
             "--max-model-len", 256, "--tokens", ids], expect_ok=False)
    ok(r.returncode == 1 and "gated-DeltaNet" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
       f"check refuses a qwen3_next model before vLLM starts: {r.stderr.strip()}")
    from transformers import AutoConfig

    llama_cfg = AutoConfig.from_pretrained(fixtures / "llama_vllm")
    policy = read_policy(write_policy(tmp / "g.yaml", g, POLICIES["gemma3_vllm"]))
    for what, config, model_dir, needle in (
            ("another model's policy", llama_cfg, fixtures / "llama_vllm", "config_sha256"),
            ("another model's layers", llama_cfg, None, "global attention layers are [0, 1, 2, 3]"),
            ("an unserved family", AutoConfig.from_pretrained(fixtures / "qwen3_next_tiny"), None,
             "does not serve gated-DeltaNet hybrids")):
        try:
            plan_model(policy, config, str(model_dir) if model_dir else None)
            ok(False, f"plan_model refuses {what}")
        except PolicyError as e:
            ok(needle in str(e), f"plan_model refuses {what}: {e}")


def reference(cli, fixture, tokens, tmp, policy=None):
    """log-softmax of headwise-calc forward [--policy] over `tokens`."""
    ids = tmp / "ref_ids.json"
    ids.write_text(json.dumps(tokens))
    out = tmp / "ref.safetensors"
    run([cli, "forward", "--model", fixture, "--tokens", ids, "-o", out, "-q"] + (["--policy", policy] if policy else []))
    return torch.log_softmax(load_file(str(out))["logits"].double(), dim=-1)


def engine_args(view, policy, tokens_path, logprobs_out=None):
    return check.parse_args(["--model", str(view), "--policy", str(policy), "--max-model-len", str(MAX_MODEL_LEN),
                             "--tokens", str(tokens_path), "--dtype", "float32", "--enforce-eager",
                             "--max-num-batched-tokens", str(BATCHED_TOKENS), "--new-tokens", str(NEW_TOKENS)]
                            + (["--logprobs-out", str(logprobs_out)] if logprobs_out else []))


def check_parity(cli, fixture, policy, prompt, report, lp_path, tmp):
    vl = load_file(str(lp_path))
    tokens = report["tokens"]
    # One forward over the prompt and the first 7 generated tokens: position n-1+i predicts token i.
    ref = reference(cli, fixture, prompt + tokens[:-1], tmp, policy)
    n = len(prompt)
    prompt_diff = (ref[:n - 1] - vl["prompt_logprobs"].double()).abs().max().item()
    gen_diff = (ref[n - 1:] - vl["generated_logprobs"].double()).abs().max().item()
    greedy = ref[n - 1:].argmax(-1).tolist()
    full = reference(cli, fixture, prompt, tmp)
    effect = (ref[:n] - full).abs().max().item()
    ok(prompt_diff <= TOL and gen_diff <= TOL and greedy == tokens and effect > 1e-2,
       f"{fixture.name} {n} tokens: vLLM vs forward --policy log-probabilities max |diff| prompt {prompt_diff:.1e}, "
       f"generated {gen_diff:.1e}; greedy {tokens} == decoder argmax {greedy}; policy vs full KV {effect:.2f}")


def mem_estimate(cli, report, *source):
    out = run([cli, "mem-estimate", *source, "--engine", "vllm", "--json", "--max-model-len", report["max_model_len"],
               "--block-size", report["block_size"], "--max-num-batched-tokens", report["max_num_batched_tokens"],
               "--kv-dtype", report["model_dtype"]]).stdout
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
        tmp = pathlib.Path(d)
        check_plan_unit()
        check_refusals(fixtures, tmp)
        predicted = {}
        rng_none = random.Random(41)
        none_report = none_estimate = None
        if not args.only or "gemma3_vllm" in args.only:
            # First, before any engine with a policy: the plugin must take over from the stock
            # class in a process that already built it (vLLM caches a folder's class).
            fixture = fixtures / "gemma3_vllm"
            ids = tmp / "none.json"
            ids.write_text(json.dumps([rng_none.randrange(128) for _ in range(PROMPTS[0])]))
            none_report = check.run(engine_args(model_view(fixture, tmp), "none", ids))
            none_estimate = mem_estimate(args.cli, none_report, "--full-kv", "--model", fixture)
            predicted[("gemma3_vllm", "none")] = check_bytes(args.cli, "gemma3_vllm without a policy", none_report,
                                                             none_estimate)
        for name, windows in POLICIES.items():
            if args.only and name not in args.only:
                continue
            fixture = fixtures / name
            view = model_view(fixture, tmp)
            policy = write_policy(tmp / f"{name}.yaml", fixture, windows)
            vocab = json.loads((fixture / "config.json").read_text())["vocab_size"]
            t0 = time.time()
            reports = []
            for n in PROMPTS:
                prompt = [rng.randrange(vocab) for _ in range(n)]
                ids = tmp / f"{name}_{n}.json"
                ids.write_text(json.dumps(prompt))
                lp = tmp / f"{name}_{n}.logprobs.safetensors"
                report = check.run(engine_args(view, policy, ids, lp))
                check_parity(args.cli, fixture, policy, prompt, report, lp, tmp)
                reports.append(report)
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
