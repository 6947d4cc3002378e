#!/usr/bin/env python3
"""The runtime decoder's recurrent/conv states on bf16 checkpoints, against transformers.

On the shipped models (bf16, Qwen3-Next layout) and a bf16 copy of a fixture, for an all-full
policy with float32 K/V and prefill chunks of 16 and 256 over 700 tokens (fewer on the fixture):
- `state_dtype: float32`: `headwise-calc forward --policy` equals the plain `forward` (one call)
  within 1e-4 x max|logit|, and so does HeadwiseCache's chunked prefill in transformers;
- `state_dtype: bfloat16`: `forward --policy` equals an independent reference, transformers'
  own model and DynamicCache run chunk by chunk with every linear-attention state rounded to bf16
  after each chunk (what "a state kept in bf16 between chunks" means), and HeadwiseCache with the
  same policy equals it too; the rounding must matter (the reference moves away from one call),
  or the comparison would show nothing;
- a policy without the field (native states: conv states in the checkpoint's dtype, recurrent
  states in float32, what every policy meant before the field) equals the reference that rounds
  only the conv states.

Usage: test_state_dtype.py --cli build/bin/headwise-calc [--fixtures tests/fixtures] [--models models]
Exit 0 on success, 1 on any failure; without torch/transformers as test_hf_cache.py (1, or 77 with
HEADWISE_PYTHON_STACK_OPTIONAL=1).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SKIP_EXIT_CODE = 77
EXACT = 1e-4  # x max|logit|: the bound for fp32 states against the one-call forward
# x max|logit|, for rounded states against the reference that rounds them at the same points:
# measured <= 1e-6 (HeadwiseCache: 0, as it runs the same ATen kernels in the same order, sdpa's
# fused attention included; any last-bit difference before a rounding can become a whole bf16 step
# of a state, 4e-5 x max|logit| on tiny-qwen3-next-8k with the explicit attention), while the
# rounding itself moves the logits by 1.5e-4 (fixture) to 1e-3 (shipped models) of their scale,
# which the test also requires (> 10x this bound), or the comparison could not fail.
ROUNDED = 1e-5

# The kernels headwise-calc runs (libheadwise pins MKL/ATen/oneDNN to AVX2 when it loads): the
# transformers side must run the same ones, so this comes before torch is imported.
import cpu_paths  # noqa: E402  (this folder)

cpu_paths.pin()

try:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
except ImportError as e:
    if os.environ.get("HEADWISE_PYTHON_STACK_OPTIONAL") == "1":
        print(f"SKIP (HEADWISE_PYTHON_STACK_OPTIONAL=1): {e}")
        sys.exit(SKIP_EXIT_CODE)
    print(f"FAIL: the Python stack is missing ({e}); tools/setup.sh installs it")
    sys.exit(1)

sys.path.insert(0, str(ROOT / "python"))
from headwise_hf import HeadwiseCache  # noqa: E402
from headwise_hf.policy import config_sha256  # noqa: E402

from checklist import Checklist  # noqa: E402  (this folder)

check = Checklist()


def run(cli, *args):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"FAIL {' '.join(map(str, args))}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def full_policy(path, model_dir, config, context, state_dtype):
    """An all-full policy with float32 K/V (no memory block: the reader then checks the layers)."""
    types = config.layer_types
    lines = ["schema: headwise/policy/v1", f'model_name: "{model_dir.name}"', f'model_path: "{model_dir}"',
             "model_fingerprint:", f"  config_sha256: {config_sha256(model_dir)}", "budget_gb: 0",
             f"context: {context}", "batch: 1", "dtype: float32"]
    if state_dtype:
        lines.append(f"state_dtype: {state_dtype}")
    lines += ["block_size: 16", "sink_tokens: 0", "window_levels: [full]", "per_layer_policies:"]
    for i, t in enumerate(types):
        if t == "full_attention":
            heads = ", ".join(["full"] * config.num_key_value_heads)
            lines += [f"  - layer_id: {i}", f"    kv_head_windows: [{heads}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def cli_logits(cli, model_dir, ids_path, out, *extra):
    run(cli, "forward", "--model", model_dir, "--tokens", ids_path, "-o", out, "-q", *extra)
    return load_file(str(out))["logits"]


def rounded_states_reference(model, ids, chunk, conv_dtype, recurrent_dtype):
    """transformers' model and DynamicCache, chunk by chunk; after each chunk every linear-attention
    layer's conv/recurrent states are rounded to the given dtypes (None: left as transformers keeps
    them) and stored back in their own dtype. Written apart from HeadwiseCache and the decoder."""
    cache = DynamicCache(config=model.config)
    outs = []
    with torch.no_grad():
        for t0 in range(0, ids.shape[1], chunk):
            outs.append(model(ids[:, t0:t0 + chunk], past_key_values=cache, use_cache=True).logits[0].float())
            for layer in cache.layers:
                if not isinstance(layer, LinearAttentionCacheLayerMixin):
                    continue
                for states, dtype in ((layer.conv_states, conv_dtype), (layer.recurrent_states, recurrent_dtype)):
                    for t in states.values():
                        if t is not None and dtype is not None:
                            t.copy_(t.to(dtype).to(t.dtype))
    return torch.cat(outs)


def headwise_cache_logits(model, policy, ids, chunk):
    cache = HeadwiseCache.from_policy(policy, model)
    outs = []
    with torch.no_grad():
        for t0 in range(0, ids.shape[1], chunk):
            outs.append(model(ids[:, t0:t0 + chunk], past_key_values=cache, use_cache=True).logits[0].float())
    model.set_attn_implementation("sdpa")  # from_policy switched it; the reference runs sdpa
    return torch.cat(outs)


def gap(a, b):
    return (a - b).abs().max().item()


def check_model(cli, model_dir, tmp, tokens, chunks):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa").eval()
    config = model.config.get_text_config(decoder=True)
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=g)
    ids_path = tmp / f"{model_dir.name}.ids.json"
    ids_path.write_text(json.dumps(ids[0].tolist()))
    context = max(1024, tokens)
    policies = {s: full_policy(tmp / f"{model_dir.name}.{s or 'native'}.yaml", model_dir, config, context, s)
                for s in ("float32", "bfloat16", None)}
    plain = cli_logits(cli, model_dir, ids_path, tmp / "plain.st")
    scale = plain.abs().max().item()
    name = model_dir.name
    for chunk in chunks:
        where = f"{name}, {tokens} tokens, prefill chunk {chunk}"
        fp32 = cli_logits(cli, model_dir, ids_path, tmp / "fp32.st", "--policy", policies["float32"],
                          "--prefill-chunk", chunk)
        d = gap(fp32, plain)
        check(d <= EXACT * scale, f"{where}: forward --policy, float32 states vs plain forward: {d:.2e} "
                                  f"(bound {EXACT:.0e} x {scale:.1f})")
        hf = headwise_cache_logits(model, policies["float32"], ids, chunk)
        d = gap(hf, plain)
        check(d <= EXACT * scale, f"{where}: HeadwiseCache, float32 states vs plain forward: {d:.2e}")

        reference = rounded_states_reference(model, ids, chunk, torch.bfloat16, torch.bfloat16)
        bf16 = cli_logits(cli, model_dir, ids_path, tmp / "bf16.st", "--policy", policies["bfloat16"],
                          "--prefill-chunk", chunk)
        moved = gap(reference, plain)
        d = gap(bf16, reference)
        check(moved > 10 * ROUNDED * scale and d <= ROUNDED * scale,
              f"{where}: forward --policy, bfloat16 states vs transformers rounding them after each chunk: "
              f"{d:.2e} (bound {ROUNDED:.0e} x scale; the rounding itself moves the logits {moved:.2e})")
        hf = headwise_cache_logits(model, policies["bfloat16"], ids, chunk)
        d = gap(hf, reference)
        check(d <= ROUNDED * scale, f"{where}: HeadwiseCache, bfloat16 states vs the same reference: {d:.2e}")

        native_ref = rounded_states_reference(model, ids, chunk, torch.bfloat16, None)
        native = cli_logits(cli, model_dir, ids_path, tmp / "native.st", "--policy", policies[None],
                            "--prefill-chunk", chunk)
        d = gap(native, native_ref)
        check(d <= ROUNDED * scale and gap(native_ref, plain) > 10 * ROUNDED * scale,
              f"{where}: forward --policy, native states (no state_dtype) vs the reference rounding conv states "
              f"only: {d:.2e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cli", required=True)
    p.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    p.add_argument("--models", default=str(ROOT / "models"))
    args = p.parse_args()
    torch.set_num_threads(1)
    models = pathlib.Path(args.models)
    # (model, tokens, prefill chunks): the 700 tokens at chunks 16 and 256 on the shipped
    # models; the fixture (256 positions) at chunks across its gated-delta chunk of 64.
    cases = [(pathlib.Path(args.fixtures) / "qwen3_next_tiny_bf16", 240, (16, 64)),
             (models / "tiny-qwen3-next", 700, (16, 256)),
             (models / "tiny-qwen3-next-8k", 700, (16, 256))]
    with tempfile.TemporaryDirectory(prefix="headwise-states-") as d:
        for model_dir, tokens, chunks in cases:
            check_model(args.cli, model_dir, pathlib.Path(d), tokens, chunks)
    return check.exit_status()


if __name__ == "__main__":
    sys.exit(main())
