#!/usr/bin/env python3
"""python/headwise_hf against headwise's runtime decoder (`headwise-calc forward --policy`).

For each fixture (tiny random-weight HF checkpoints in tests/fixtures) and a policy with mixed
windows and sink tokens, chunked prefill through HeadwiseCache must give the logits
`forward --policy` gives (<= 1e-4, fp32); with `full` everywhere both must equal the plain
full-KV logits (transformers' and `forward`'s); the cache's K/V bytes must equal
`mem-estimate --config policy.yaml --json` global_kv_bytes at the cached length (and at the
policy's context with preallocate=True); generate() must run through the cache; the same with
h2o heads (kv_head_rules) in the first global layer, served as the runtime serves them (logits
equal forward --policy's at the same prefill chunk, K/V and position/score bytes equal
mem-estimate's global_kv_bytes and selection_state_bytes, decoding evicts); forward --policy must
refuse another model's policy, a context overflow and a stray --prefill-chunk; the layers that pass
sink logits (gpt-oss) without a headwise plan run transformers' own gpt-oss eager attention; one
version number (python/pyproject.toml, headwise_hf, headwise_vllm, CMakeLists.txt, headwise-calc).

Usage: test_hf_cache.py --cli build/bin/headwise-calc [--fixtures tests/fixtures]
Exit 0 on success, 1 on any failure. Without torch/transformers/safetensors: 1 (tools/test.sh, which
CI runs, installs them, so their absence is a broken set-up), or 77 (ctest's SKIP_RETURN_CODE) when
HEADWISE_PYTHON_STACK_OPTIONAL=1 says a Python-less run may skip this entry.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOL = 1e-4

SKIP_EXIT_CODE = 77  # tests/CMakeLists.txt's HEADWISE_TEST_SKIP_CODE; failures exit 1

# The kernels headwise-calc runs (libheadwise pins MKL/ATen/oneDNN to AVX2 when it loads): the
# transformers side must run the same ones, so this comes before torch is imported.
import cpu_paths  # noqa: E402  (this folder)

cpu_paths.pin()

try:
    import torch
    import transformers  # noqa: F401
    from safetensors.torch import load_file
except ImportError as e:
    if os.environ.get("HEADWISE_PYTHON_STACK_OPTIONAL") == "1":
        print(f"SKIP (HEADWISE_PYTHON_STACK_OPTIONAL=1): {e}")
        sys.exit(SKIP_EXIT_CODE)
    print(f"FAIL: the Python stack is missing ({e}); tools/setup.sh installs it "
          "(HEADWISE_PYTHON_STACK_OPTIONAL=1 lets this entry skip instead)")
    sys.exit(1)

sys.path.insert(0, str(ROOT / "python"))
from headwise_hf import HeadwiseCache  # noqa: E402
from headwise_hf.policy import config_sha256  # noqa: E402

from checklist import Checklist  # noqa: E402  (this folder)

check = Checklist()


def run(cli, *args, expect_ok=True):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if expect_ok and r.returncode != 0:
        raise SystemExit(f"FAIL {' '.join(map(str, args))}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def global_layers(config):
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return [i for i, t in enumerate(types) if t == "full_attention"]


def write_policy(path, fixture_dir, windows, *, context, sinks, levels, dtype="float32", block=16, rules=None):
    """A hand-written serving policy (no memory block: headwise's reader then checks only the
    layers and windows against the model); `rules`: layer -> kv_head_rules."""
    name = lambda w: "full" if w is None else str(w)  # noqa: E731
    lines = [
        "schema: headwise/policy/v1",
        f'model_name: "{fixture_dir.name}"',
        f'model_path: "{fixture_dir}"',
        "model_fingerprint:",
        f"  config_sha256: {config_sha256(fixture_dir)}",
        "budget_gb: 0",
        f"context: {context}",
        "batch: 1",
        f"dtype: {dtype}",
        f"block_size: {block}",
        f"sink_tokens: {sinks}",
        f"window_levels: [{', '.join(name(w) for w in levels)}]",
        "per_layer_policies:",
    ]
    for layer, heads in sorted(windows.items()):
        lines += [f"  - layer_id: {layer}", f"    kv_head_windows: [{', '.join(name(w) for w in heads)}]"]
        if rules and layer in rules:
            lines += [f"    kv_head_rules: [{', '.join(rules[layer])}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def hf_logits(model, ids, cache, chunks):
    outs, a = [], 0
    with torch.no_grad():
        for c in chunks:
            outs.append(model(ids[:, a:a + c], past_key_values=cache, use_cache=True).logits[0])
            a += c
    assert a == ids.shape[1]
    return torch.cat(outs).float()


def cli_logits(cli, fixture, ids_path, out, *extra):
    run(cli, "forward", "--model", fixture, "--tokens", ids_path, "-o", out, "-q", *extra)
    return load_file(str(out))["logits"]


def estimate_components(cli, policy, context=None):
    args = ["mem-estimate", "--config", policy, "--json"] + (["--context", context] if context else [])
    return json.loads(run(cli, *args).stdout)["components"]


def estimate_global_kv(cli, policy, context=None):
    return estimate_components(cli, policy, context)["global_kv_bytes"]


def check_h2o(cli, fixture, model, ids, ids_path, tmp, mixed, chunk, plain):
    """kv_head_rules served as the runtime serves them: H2O in an h2o head's slots, evicting after
    every chunk; the layer's window heads keep their windows."""
    from headwise_hf.cache import HeadwiseH2OLayer

    first = sorted(mixed)[0]
    rules = {first: ["h2o" if h % 2 == 0 else "window" for h in range(len(mixed[first]))]}
    policy = write_policy(tmp / f"{fixture.name}.h2o.yaml", fixture, mixed, context=256, sinks=3,
                          levels=[8, 24, None], rules=rules)
    ref = cli_logits(cli, fixture, ids_path, tmp / "h2o.st", "--policy", policy, "--prefill-chunk", chunk)
    seq_len = ids.shape[1]
    chunks = [chunk] * (seq_len // chunk) + ([seq_len % chunk] if seq_len % chunk else [])
    cache = HeadwiseCache.from_policy(policy, model)
    got = hf_logits(model, ids, cache, chunks)
    diff = (got - ref).abs().max().item()
    windows_only = cli_logits(cli, fixture, ids_path, tmp / "win.st", "--policy",
                              write_policy(tmp / f"{fixture.name}.win.yaml", fixture, mixed, context=256, sinks=3,
                                           levels=[8, 24, None]), "--prefill-chunk", chunk)
    check(diff <= TOL and isinstance(cache.layers[first], HeadwiseH2OLayer) and
          (ref - windows_only).abs().max().item() > 1e-3,
          f"{fixture.name}: h2o heads {rules} (HeadwiseCache, chunks of {chunk}) vs forward --policy: max |diff| "
          f"{diff:.2e}; h2o changes the logits by {(ref - windows_only).abs().max().item():.2e} from windows")
    est = estimate_components(cli, policy, context=seq_len)
    check(cache.kv_bytes() == est["global_kv_bytes"] and cache.selection_bytes() == est["selection_state_bytes"],
          f"{fixture.name}: h2o layer bytes: K/V {cache.kv_bytes()} == {est['global_kv_bytes']}, positions/scores "
          f"{cache.selection_bytes()} == selection_state_bytes {est['selection_state_bytes']} (mem-estimate at {seq_len})")
    # Token by token after a prefill chunk: decode steps evict too.
    cache = HeadwiseCache.from_policy(policy, model)
    with torch.no_grad():
        out = model.generate(ids[:, :100], past_key_values=cache, max_new_tokens=8, do_sample=False,
                             pad_token_id=0, min_new_tokens=8)
    held = cache.layers[first].heads[0].held[0]
    check(out.shape[1] == 108 and held == cache.layers[first].heads[0].capacity,
          f"{fixture.name}: generate() through an h2o layer (head 0 holds {held} of its "
          f"{cache.layers[first].heads[0].capacity} slots)")


def check_snap(cli, fixture, model, ids, ids_path, tmp, mixed, chunk):
    """snap heads (kv_head_rules) served as the runtime serves them: beside window and h2o heads of
    one layer, the prompt staged and chosen at its end; logits equal forward --policy's, the bytes
    mem-estimate's (steady, and the prefill peak at both schedules), decoding keeps the slots."""
    from headwise_hf.cache import HeadwiseH2OLayer

    layers = sorted(mixed)
    heads = len(mixed[layers[0]])
    rules = {layers[0]: ["snap" if h % 2 == 0 else "window" for h in range(heads)]}
    if len(layers) > 1:  # snap beside h2o (and, with three KV heads or more, window) in one layer
        rules[layers[-1]] = [("snap", "h2o", "window")[h % 3] for h in range(heads)]
    policy = write_policy(tmp / f"{fixture.name}.snap.yaml", fixture, mixed, context=256, sinks=3,
                          levels=[8, 24, None], rules=rules)
    seq_len = ids.shape[1]
    ref = cli_logits(cli, fixture, ids_path, tmp / "snap.st", "--policy", policy, "--prefill-chunk", chunk)
    chunks = [chunk] * (seq_len // chunk) + ([seq_len % chunk] if seq_len % chunk else [])
    cache = HeadwiseCache.from_policy(policy, model, preallocate=True)
    cache.set_prompt_length(seq_len)
    got = hf_logits(model, ids, cache, chunks)
    diff = (got - ref).abs().max().item()
    check(diff <= TOL and isinstance(cache.layers[layers[0]], HeadwiseH2OLayer),
          f"{fixture.name}: snap heads {rules} (HeadwiseCache, chunks of {chunk}) vs forward --policy: max |diff| {diff:.2e}")
    est = json.loads(run(cli, "mem-estimate", "--config", policy, "--json", "--prompt-tokens", seq_len).stdout)
    c = est["components"]
    others = est["total_bytes"] - c["global_kv_bytes"] - c["selection_state_bytes"]  # local/recurrent: not HeadwiseCache's
    cache.end_prompt()
    steady = cache.kv_bytes() + cache.selection_bytes()
    check(steady == c["global_kv_bytes"] + c["selection_state_bytes"] and cache.staged_bytes() == 0 and
          cache.peak_bytes() == est["prefill"]["whole_prompt_peak_bytes"] - others,
          f"{fixture.name}: snap bytes: steady {steady} == mem-estimate {c['global_kv_bytes'] + c['selection_state_bytes']}, "
          f"prefill peak (whole schedule) {cache.peak_bytes()} == {est['prefill']['whole_prompt_peak_bytes'] - others}")
    # The layer schedule: the prompt in one call, each layer chooses right after it (as kvpress).
    layered = HeadwiseCache.from_policy(policy, model, preallocate=True, prefill_schedule="layer")
    one = hf_logits(model, ids, layered, [seq_len])
    ref_one = cli_logits(cli, fixture, ids_path, tmp / "snap1.st", "--policy", policy, "--prefill-chunk", seq_len,
                         "--prefill-schedule", "layer")
    check(layered.peak_bytes() == est["prefill"]["layer_by_layer_peak_bytes"] - others and
          (one - ref_one).abs().max().item() <= TOL,
          f"{fixture.name}: snap prefill peak (layer schedule) {layered.peak_bytes()} == "
          f"{est['prefill']['layer_by_layer_peak_bytes'] - others}, logits as forward --policy --prefill-schedule layer's "
          f"(one chunk): max |diff| {(one - ref_one).abs().max().item():.2e}")
    try:
        chunked = HeadwiseCache.from_policy(policy, model, prefill_schedule="layer")
        chunked.set_prompt_length(seq_len)
        hf_logits(model, ids, chunked, chunks)
        refused = ""
    except ValueError as e:
        refused = str(e)
    check("prefill_schedule" in refused and "\n" not in refused, f"layer schedule with chunks refused: {refused}")
    # The choice itself: the runtime's keep rule on the staged prompt (positions kept per head).
    layer = cache.layers[layers[0]]
    for h, head in enumerate(layer.heads):
        if head.snap:
            held = head.position[0, :head.held[0]].tolist()
            window = list(range(seq_len - 32, seq_len))
            check(head.held[0] == min(head.capacity, seq_len) and held[-len(window):] == window[-head.held[0]:],
                  f"{fixture.name}: snap head {h} keeps {head.held[0]} of {head.capacity} slots, the observation "
                  f"window among them")
    # Decoding rotates the ring and keeps the selected keys.
    cache = HeadwiseCache.from_policy(policy, model)
    with torch.no_grad():
        out = model.generate(ids[:, :100], past_key_values=cache, max_new_tokens=8, do_sample=False,
                             pad_token_id=0, min_new_tokens=8)
    head = cache.layers[layers[0]].heads[0]
    held = sorted(head.position[0, :head.held[0]].tolist())
    ring = min(cache.layers[layers[0]].snap_ring, head.capacity)
    check(out.shape[1] == 108 and head.held[0] == head.capacity and held[-ring:] == list(range(107 - ring, 107)),
          f"{fixture.name}: generate() through a snap layer (prompt = the first call, 100 tokens; head 0 holds "
          f"{head.held[0]} of {head.capacity} slots, its {ring}-slot ring the latest tokens)")
    check_chunked_generate(fixture, model, ids, policy, layers[0])


def check_chunked_generate(fixture, model, ids, policy, layer):
    """A prompt prefilled in chunks reaches the snap heads whole (headwise_hf/prompt.py): generate's
    chunked prefill tells the cache the prompt's length, even when its last chunk is one token (which
    looks like a decoded token); an untold chunk after the first, in a user's own calls, is refused."""

    def generate(chunk, new, told):
        cache = HeadwiseCache.from_policy(policy, model)
        if told:
            cache.set_prompt_length(100)
        try:
            with torch.no_grad():
                out = model.generate(ids[:, :100], past_key_values=cache, max_new_tokens=new, min_new_tokens=new,
                                     do_sample=False, pad_token_id=0, prefill_chunk_size=chunk)
        except ValueError as e:  # refused: the cache was not told
            return None, None, str(e)
        heads = cache.layers[layer].heads
        return out[0, 100:].tolist(), [h.position[0, :h.held[0]].tolist() for h in heads if h.snap], cache.prompt.end

    for chunk, new in ((33, 8), (99, 2)):  # 33+33+33+1 and 99+1: a one-token last chunk
        got, told = generate(chunk, new, False), generate(chunk, new, True)
        check(got[2] == 100 and got == told,
              f"{fixture.name}: generate(prefill_chunk_size={chunk}) through snap heads: the prompt ends at "
              f"{got[2]} of 100 tokens, tokens and snap positions as with set_prompt_length(100): {got[:2] == told[:2]}")
    cache = HeadwiseCache.from_policy(policy, model)
    try:
        hf_logits(model, ids[:, :100], cache, [50, 50])
        refused = ""
    except ValueError as e:
        refused = str(e)
    check("set_prompt_length" in refused and "50 tokens" in refused and "\n" not in refused,
          f"{fixture.name}: a second prompt chunk without set_prompt_length refused: {refused}")


def check_fixture(cli, fixture, tmp, seq_len, chunk, mixed_levels):
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(str(fixture), dtype=torch.float32).eval()
    config = model.config.get_text_config(decoder=True)
    num_kv = config.num_key_value_heads
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, config.vocab_size, (1, seq_len), generator=g)
    ids_path = tmp / f"{fixture.name}.ids.json"
    ids_path.write_text(json.dumps(ids[0].tolist()))
    layers = global_layers(config)
    # Mixed windows: every ladder level somewhere, rotating over (layer, head).
    mixed = {l: [mixed_levels[(i * num_kv + h) % len(mixed_levels)] for h in range(num_kv)] for i, l in enumerate(layers)}
    mixed_policy = write_policy(tmp / f"{fixture.name}.mixed.yaml", fixture, mixed, context=256, sinks=3,
                                levels=mixed_levels)
    full_policy = write_policy(tmp / f"{fixture.name}.full.yaml", fixture, {l: [None] * num_kv for l in layers},
                               context=256, sinks=0, levels=[None])
    chunks = [chunk] * (seq_len // chunk) + ([seq_len % chunk] if seq_len % chunk else [])
    uneven = [1, 2, 29, 70, 5] + [seq_len - 107]

    # Mixed windows and sinks: HeadwiseCache (two chunkings) vs the runtime decoder.
    ref = cli_logits(cli, fixture, ids_path, tmp / "mixed.st", "--policy", mixed_policy, "--prefill-chunk", chunk)
    for name, ch in (("chunks of %d" % chunk, chunks), ("uneven chunks", uneven)):
        cache = HeadwiseCache.from_policy(mixed_policy, model)
        got = hf_logits(model, ids, cache, ch)
        diff = (got - ref).abs().max().item()
        check(diff <= TOL, f"{fixture.name}: HeadwiseCache ({name}) vs forward --policy, windows {mixed}, sinks 3: "
                           f"max |diff| {diff:.2e}")
        est = estimate_global_kv(cli, mixed_policy, context=seq_len)
        check(cache.kv_bytes() == est, f"{fixture.name}: K/V bytes {cache.kv_bytes()} == mem-estimate global_kv_bytes "
                                       f"at context {seq_len} ({est})")
    pre = HeadwiseCache.from_policy(mixed_policy, model, preallocate=True)
    got = hf_logits(model, ids, pre, chunks)
    est = estimate_global_kv(cli, mixed_policy)
    check(pre.kv_bytes() == est and (got - ref).abs().max().item() <= TOL,
          f"{fixture.name}: preallocated at the policy's context: bytes {pre.kv_bytes()} == {est}, same logits")
    # The windows must matter on these sequences, or the comparison shows nothing.
    plain = cli_logits(cli, fixture, ids_path, tmp / "plain.st")
    check((ref - plain).abs().max().item() > 1e-3, f"{fixture.name}: the mixed policy changes the logits "
                                                  f"({(ref - plain).abs().max().item():.2e} from full KV)")

    # Full everywhere: both equal the plain full-KV logits.
    full_cli = cli_logits(cli, fixture, ids_path, tmp / "full.st", "--policy", full_policy, "--prefill-chunk", chunk)
    full_hf = hf_logits(model, ids, HeadwiseCache.from_policy(full_policy, model), chunks)
    # transformers has no sdpa path for gpt-oss's sink logits: its reference is eager attention.
    model.set_attn_implementation("eager" if config.model_type == "gpt_oss" else "sdpa")
    with torch.no_grad():
        hf_plain = model(ids).logits[0].float()
    for name, a, b in (("forward --policy full vs forward", full_cli, plain),
                       ("HeadwiseCache full vs forward", full_hf, plain),
                       ("HeadwiseCache full vs transformers full KV", full_hf, hf_plain)):
        diff = (a - b).abs().max().item()
        check(diff <= TOL, f"{fixture.name}: {name}: max |diff| {diff:.2e}")

    # generate() through the cache continues the sequence and keeps its bytes at the estimate.
    cache = HeadwiseCache.from_policy(mixed_policy, model)
    with torch.no_grad():
        out = model.generate(ids[:, :100], past_key_values=cache, max_new_tokens=8, do_sample=False,
                             pad_token_id=0, min_new_tokens=8)
    check(out.shape[1] == 108 and cache.get_seq_length() == 107 and
          cache.kv_bytes() == estimate_global_kv(cli, mixed_policy, context=107),
          f"{fixture.name}: generate() through HeadwiseCache (8 new tokens, cache length {cache.get_seq_length()})")
    check_h2o(cli, fixture, model, ids, ids_path, tmp, mixed, chunk, plain)
    check_snap(cli, fixture, model, ids, ids_path, tmp, mixed, chunk)
    print(f"     {fixture.name}: {time.time() - t0:.1f} s", flush=True)
    return mixed_policy, ids_path


def check_errors(cli, fixtures, tmp, mixed_policy, ids_path):
    other = fixtures / "qwen3_next_tiny_b"
    r = run(cli, "forward", "--model", other, "--tokens", ids_path, "-o", tmp / "x.st", "--policy", mixed_policy,
            expect_ok=False)
    check(r.returncode == 1 and "--policy" in r.stderr and "config_sha256" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          f"forward --policy refuses another model's policy: {r.stderr.strip()}")
    long_ids = tmp / "long.json"
    long_ids.write_text(json.dumps([1] * 257))
    r = run(cli, "forward", "--model", fixtures / "qwen3_next_tiny", "--tokens", long_ids, "-o", tmp / "x.st",
            "--policy", mixed_policy, expect_ok=False)
    check(r.returncode == 1 and "--tokens" in r.stderr and "context of 256" in r.stderr,
          f"forward --policy refuses more tokens than the policy's context: {r.stderr.strip()}")
    r = run(cli, "forward", "--model", fixtures / "qwen3_next_tiny", "--tokens", ids_path, "-o", tmp / "x.st",
            "--prefill-chunk", "8", expect_ok=False)
    check(r.returncode == 1 and "--prefill-chunk" in r.stderr, f"--prefill-chunk only with --policy: {r.stderr.strip()}")
    r = run(cli, "forward", "--model", fixtures / "qwen3_next_tiny", "--tokens", ids_path, "-o", tmp / "x.st",
            "--policy", mixed_policy, "--prefill-chunk", "0", expect_ok=False)
    check(r.returncode == 1 and "--prefill-chunk" in r.stderr, f"--prefill-chunk 0: {r.stderr.strip()}")
    r = run(cli, "forward", "--model", fixtures / "qwen3_next_tiny", "--tokens", ids_path, "-o", tmp / "x.st",
            "--runtime-attention", "explicit", expect_ok=False)
    check(r.returncode == 1 and "--runtime-attention" in r.stderr, f"--runtime-attention only with --policy: {r.stderr.strip()}")
    r = run(cli, "forward", "--model", fixtures / "qwen3_next_tiny", "--tokens", ids_path, "-o", tmp / "x.st",
            "--policy", mixed_policy, "--runtime-attention", "flash", expect_ok=False)
    check(r.returncode == 1 and "--runtime-attention" in r.stderr and "fused, explicit" in r.stderr and
          len(r.stderr.strip().splitlines()) == 1, f"--runtime-attention flash: {r.stderr.strip()}")
    # The fused and the explicit runtime attention give the same logits up to rounding.
    fixture = fixtures / "qwen3_next_tiny"
    fused = cli_logits(cli, fixture, ids_path, tmp / "fused.st", "--policy", mixed_policy)
    explicit = cli_logits(cli, fixture, ids_path, tmp / "explicit.st", "--policy", mixed_policy,
                          "--runtime-attention", "explicit")
    diff = (fused - explicit).abs().max().item()
    check(diff <= TOL, f"forward --policy: fused vs explicit attention max |diff| {diff:.2e}")


def check_version(cli):
    """One version number: headwise_hf's __version__ is what pyproject.toml reads, what headwise_vllm
    exports, the C++ project's (CMakeLists.txt) and what headwise-calc --version prints."""
    import re
    import tomllib

    import headwise_hf
    import headwise_vllm

    version = headwise_hf.__version__
    project = tomllib.loads((ROOT / "python" / "pyproject.toml").read_text())
    dynamic = project["tool"]["setuptools"].get("dynamic", {}).get("version", {})
    cmake = re.search(r"project\(headwise VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text())
    printed = run(cli, "--version").stdout.strip()
    check("version" not in project["project"] and "version" in project["project"].get("dynamic", [])
          and dynamic == {"attr": "headwise_hf.__version__"} and headwise_vllm.__version__ == version
          and cmake and cmake.group(1) == version and printed == version,
          f"one version number {version}: pyproject.toml's dynamic version {dynamic}, headwise_vllm "
          f"{headwise_vllm.__version__}, CMakeLists.txt {cmake and cmake.group(1)}, headwise-calc --version {printed}")


def check_sink_attention():
    """Layers that pass sink logits (gpt-oss's s_aux) and hold no headwise plan run transformers'
    own gpt-oss eager attention: equal to it under its additive causal mask, with sdpa's bool mask
    and with none (plainly causal)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from headwise_hf.attention import headwise_attention_forward

    g = torch.Generator().manual_seed(3)
    batch, kv, group, steps, keys, dim = 2, 2, 3, 5, 9, 8
    module = torch.nn.Module()
    module.num_key_value_groups = group
    module.sinks = torch.nn.Parameter(torch.randn(kv * group, generator=g))
    q = torch.randn(batch, kv * group, steps, dim, generator=g)
    k, v = (torch.randn(batch, kv, keys, dim, generator=g) for _ in range(2))
    visible = torch.ones(steps, keys, dtype=torch.bool).tril(keys - steps)
    additive = torch.zeros(steps, keys).masked_fill(~visible, torch.finfo(torch.float32).min)
    ref, _ = eager_attention_forward(module, q, k, v, additive[None, None].expand(batch, 1, -1, -1), scaling=0.3)
    for name, mask in (("sdpa's bool mask", visible[None, None].expand(batch, 1, -1, -1)), ("no mask", None)):
        out, _ = headwise_attention_forward(module, q, k, v, mask, scaling=0.3, s_aux=module.sinks)
        diff = (out - ref).abs().max().item()
        check(out.shape == ref.shape and diff <= 1e-6,
              f"sink-logit attention with {name} == transformers' gpt-oss eager attention: max |diff| {diff:.1e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cli", required=True, help="headwise-calc")
    p.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    p.add_argument("--only", nargs="*", help="fixture names")
    p.add_argument("--all", action="store_true", help="also the fixtures the suite leaves out for time")
    args = p.parse_args()
    torch.set_num_threads(1)
    fixtures = pathlib.Path(args.fixtures)
    check_version(args.cli)
    check_sink_attention()
    # (fixture, tokens, prefill chunk, ladder): chunks longer than the 8/24-token rings, uneven
    # chunks, one-token steps; sliding layers (gemma3) stay transformers' own.
    cases = [("qwen3_next_tiny", 200, 64, [8, 24, None]),
             ("llama_rope3", 160, 48, [8, 24, None]),
             ("qwen3_gqa", 160, 48, [8, 24, None]),
             ("gemma3_gqa4", 160, 48, [8, 24, None]),
             # gpt-oss's sink logits: its sliding layers run transformers' own gpt-oss attention
             ("gpt_oss_tiny", 160, 48, [8, 24, None])]
    if args.all:  # more of the same paths: softcapping, sliding qwen3, Qwen3.5's hybrid
        cases += [(name, 160, 48, [8, 24, None]) for name in ("gemma3_softcap", "qwen3_sliding", "qwen3_5_text_tiny",
                                                              "qwen3_yarn")]
    with tempfile.TemporaryDirectory(prefix="headwise-hf-") as d:
        tmp = pathlib.Path(d)
        for name, seq_len, chunk, levels in cases:
            if args.only and name not in args.only:
                continue
            mixed, ids_path = check_fixture(args.cli, fixtures / name, tmp, seq_len, chunk, levels)
            if name == "qwen3_next_tiny":
                check_errors(args.cli, fixtures, tmp, mixed, ids_path)
    return check.exit_status()


if __name__ == "__main__":
    sys.exit(main())
