#!/usr/bin/env python3
"""Checks a headwise policy on a model in Hugging Face transformers, with python/headwise_hf.

A needle task in the format of headwise's built-in retrieval set (src/tasks/synthetic.cpp):
needles `MARKER k1 k2 SEP v1 v2 v3` at spread depths in a haystack of recurring random
phrases of content tokens, every needle queried at the end (`MARKER k1 k2 SEP` → its value).
MARKER, SEP and the content range follow headwise's alphabet for the vocabulary: the first
min(vocab/8, 256) ids are reserved (special tokens), MARKER = that, SEP = MARKER + 1, content
above (the 512-token default model: MARKER 64, SEP 65, content 66..511). Each sample is
prefilled in chunks through the cache; a query counts as recalled when the model, teacher-forced
through the prompt, predicts all three value tokens; the last query's value is also generated
greedily with model.generate() through the same cache. Full KV (transformers' DynamicCache)
runs on the same samples; the table gives accuracy and the global-attention K/V bytes each
cache held (headwise's equal `mem-estimate --config POLICY --context SEQ_LEN` global_kv_bytes).

    PYTHONPATH=python tools/hf_policy_eval.py --model models/tiny-qwen3-next \\
        --policy policies/tiny-qwen3-next-eval-2k-25.yaml --samples 20

Swap in your own model, policy, device and benchmark: `HeadwiseCache.from_policy(policy, model)`
is the whole integration (see python/README.md).
"""
import argparse
import json
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

from headwise_hf import HeadwiseCache, read_policy  # noqa: E402

KEY_LEN, VALUE_LEN, PHRASES = 2, 3, 24


def alphabet(vocab):
    reserved = min(vocab // 8, 256)
    return reserved, reserved + 1, reserved + 2  # marker, separator, first content token


def needle_sample(rng, seq_len, vocab, needles, bos=None):
    """(tokens, queries): queries are (separator position, value tokens)."""
    marker, sep, first = alphabet(vocab)
    content = lambda k: [int(t) for t in rng.integers(first, vocab, size=k)]  # noqa: E731
    phrases = [content(int(rng.integers(3, 9))) for _ in range(PHRASES)]
    keys = [content(KEY_LEN) for _ in range(needles)]
    values = [content(VALUE_LEN) for _ in range(needles)]
    needle_len = 2 + KEY_LEN + VALUE_LEN
    head = [bos] if bos is not None else []
    haystack_len = seq_len - needles * needle_len - len(head)
    depths = [int((n + rng.random()) / needles * max(1, haystack_len - needle_len)) for n in range(needles)]
    seq, nxt = [], 0
    while len(seq) < haystack_len:
        if nxt < needles and len(seq) >= depths[nxt]:
            seq += [marker, *keys[nxt], sep, *values[nxt]]
            nxt += 1
            continue
        seq += phrases[int(rng.integers(0, PHRASES))]
    seq = head + seq[:haystack_len]
    queries = []
    for n in rng.permutation(needles):
        seq += [marker, *keys[n], sep]
        queries.append((len(seq) - 1, values[n]))
        seq += values[n]
    assert len(seq) == seq_len
    return seq, queries


def global_kv_bytes(cache, global_layers):
    if isinstance(cache, HeadwiseCache):
        return cache.kv_bytes()
    return sum(cache.layers[i].keys.untyped_storage().nbytes() + cache.layers[i].values.untyped_storage().nbytes()
               for i in global_layers)


def run_sample(model, tokens, queries, make_cache, chunk, global_layers):
    ids = torch.tensor([tokens], device=model.device)
    prompt_end = queries[-1][0] + 1  # up to the last query's separator
    cache = make_cache()
    if isinstance(cache, HeadwiseCache):
        cache.set_prompt_length(prompt_end)  # snap heads choose at the prompt's end, not the first chunk's
    logits = []
    # Chunked prefill of all but the separator; generate() feeds that and continues.
    with torch.no_grad():
        for a in range(0, prompt_end - 1, chunk):
            out = model(ids[:, a:min(a + chunk, prompt_end - 1)], past_key_values=cache, use_cache=True)
            logits.append(out.logits[0].argmax(-1))
    pred = torch.cat(logits).tolist()
    # Teacher-forced: a query's value tokens predicted from the separator and the value so far.
    recalled = 0
    for sep_pos, value in queries[:-1]:
        recalled += all(pred[sep_pos + i] == value[i] for i in range(VALUE_LEN))
    # The last query: its value generated greedily through the cache (generate() skips the
    # prefilled positions given the attention mask).
    with torch.no_grad():
        gen = model.generate(ids[:, :prompt_end], attention_mask=torch.ones_like(ids[:, :prompt_end]),
                             past_key_values=cache, max_new_tokens=VALUE_LEN, do_sample=False,
                             min_new_tokens=VALUE_LEN, pad_token_id=model.config.pad_token_id or 0)
    generated = gen[0, prompt_end:].tolist()
    recalled += generated == queries[-1][1]
    return recalled, len(queries), global_kv_bytes(cache, global_layers)


def wilson(k, n, z=1.96):
    if n == 0:
        return 0.0, 0.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen3-next"))
    p.add_argument("--policy", default=str(ROOT / "policies" / "tiny-qwen3-next-eval-2k-25.yaml"))
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=0, help="tokens per sample (default: the policy's context)")
    p.add_argument("--needles", type=int, default=0, help="default: seq_len/512, 1..8 (as headwise's set)")
    p.add_argument("--prefill-chunk", type=int, default=256)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", help="model compute dtype (float32, bfloat16, float16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-full", action="store_true", help="skip the full-KV reference run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    policy = read_policy(args.policy)
    seq_len = args.seq_len or policy.context
    if seq_len > policy.context:
        sys.exit(f"--seq-len {seq_len} exceeds the context of {policy.context} tokens of --policy {args.policy}")
    needles = args.needles or min(max(seq_len // 512, 1), 8)
    if args.samples <= 0 or args.prefill_chunk <= 0:
        sys.exit("--samples and --prefill-chunk must be positive")
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    config = model.config.get_text_config(decoder=True)
    global_layers = sorted(policy.windows)
    rng = np.random.default_rng(args.seed)
    samples = [needle_sample(rng, seq_len, config.vocab_size, needles, bos=config.bos_token_id)
               for _ in range(args.samples)]

    methods = {"headwise": lambda: HeadwiseCache.from_policy(policy, model)}
    if not args.no_full:
        methods = {"full": lambda: DynamicCache(config=model.config), **methods}
    HeadwiseCache.from_policy(policy, model)  # checks the fingerprint, installs the attention once
    rows = []
    for name, make in methods.items():
        t0 = time.time()
        correct = total = 0
        kv_bytes = 0
        for tokens, queries in samples:
            c, n, kv_bytes = run_sample(model, tokens, queries, make, args.prefill_chunk, global_layers)
            correct += c
            total += n
        lo, hi = wilson(correct, total)
        rows.append({"method": name, "correct": correct, "queries": total, "accuracy": correct / total,
                     "wilson95": [lo, hi], "global_kv_bytes": kv_bytes, "seconds": time.time() - t0})
    if args.json:
        print(json.dumps({"model": args.model, "policy": args.policy, "seq_len": seq_len, "needles": needles,
                          "samples": args.samples, "methods": rows}, indent=2))
        return
    print(f"{args.model} under {args.policy}: {args.samples} samples x {needles} needles at {seq_len} tokens, "
          f"prefill chunks of {args.prefill_chunk}, {args.device} {args.dtype}")
    print(f"{'method':<10} {'accuracy':>9} {'95% interval':>15} {'global K/V bytes':>17} {'seconds':>8}")
    for r in rows:
        print(f"{r['method']:<10} {r['accuracy']:>9.3f} {'[%.2f, %.2f]' % tuple(r['wilson95']):>15} "
              f"{r['global_kv_bytes']:>17} {r['seconds']:>8.1f}")


if __name__ == "__main__":
    main()
