#!/usr/bin/env python3
"""Needle accuracy of the default model (models/tiny-qwen3-next) at a given context, with full KV.

Held-out samples come from tools/train_default_model.py's generators with an eval seed the
training stream never uses (training draws from np.random.default_rng([seed, step])).

  passkey: one needle `MARKER k1 k2 SEP v1 v2 v3` (the format of headwise's built-in retrieval
           set) in `context` tokens of haystack, queried at the end with `MARKER k1 k2 SEP`;
           correct when greedy decoding gives v1 v2 v3.
  kv:      8 needles spread over the haystack, all queried at the end; the last one is scored.
  chain:   variable tracking (headwise eval's needle_chain): 4 needles forming one chain, each
           key the first two tokens of the previous needle's value, planted in shuffled order;
           the chain is queried at the end hop by hop, each query keyed by the previous answer;
           correct when every hop's value is.

Greedy exact match is computed from one forward pass over prompt+answer: the greedy tokens
equal the answer iff the argmax at each answer position is the answer token given the earlier
answer tokens (teacher forcing = greedy as long as it is right; for chain, the later queries'
keys are the model's own answers exactly when those are right). `--generate` decodes instead with
model.generate (KV and recurrent caches), which must agree.

    python3 tools/eval_default_model.py --context 2048 --samples 100
"""
import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import train_default_model as tdm  # noqa: E402

EVAL_SEED = 10_000_019


def make_samples(ctx, samples, seed, task):
    """(tokens, positions of the answer tokens) per sample."""
    rng = np.random.default_rng([EVAL_SEED, seed, ctx, {"passkey": 0, "kv": 1, "chain": 2}[task]])
    out = []
    for _ in range(samples):
        if task == "chain":
            toks, _, positions = tdm.sample_chain(rng, ctx)
            out.append((toks, positions))
            continue
        n = 1 if task == "passkey" else 8
        toks, _, queries = tdm.sample_needles(rng, ctx, n)
        start, answer = queries[-1]  # the last query: its answer ends the sequence
        out.append((toks, list(range(start, start + len(answer)))))
    return out


def generate_answer(model, toks, positions):
    """Greedy decoding with model.generate, run by segments: the tokens between answer runs (a
    chain's next query) are fed with the key copied from the model's own previous answer."""
    import torch

    runs = []  # (first, last + 1) of each contiguous answer run
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1][1] = p + 1
        else:
            runs.append([p, p + 1])
    seq = list(toks[:runs[0][0]])
    produced = []
    for r, (a, b) in enumerate(runs):
        if r > 0:  # marker, the previous answer's first two tokens, separator
            seq += [tdm.MARKER, *produced[-1][:2], tdm.SEP]
        x = torch.tensor([seq], device=model.device)
        y = model.generate(x, max_new_tokens=b - a, do_sample=False, pad_token_id=tdm.PAD)[0, len(seq):].tolist()
        produced.append(y)
        seq += y
    return [t for run in produced for t in run]


def needle_accuracy(model, ctx, samples=50, seed=0, task="passkey", batch=4, generate=False):
    import torch

    data = make_samples(ctx, samples, seed, task)
    hits = 0
    with torch.no_grad():
        if generate:
            for toks, positions in data:
                hits += int(generate_answer(model, toks, positions) == [toks[p] for p in positions])
            return hits / len(data)
        for i in range(0, len(data), batch):
            chunk = data[i:i + batch]
            x = torch.tensor([t for t, _ in chunk], device=model.device)
            pred = model(input_ids=x).logits.argmax(-1)
            for j, (toks, positions) in enumerate(chunk):
                hits += int(all(int(pred[j, p - 1]) == toks[p] for p in positions))
    return hits / len(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-qwen3-next"))
    ap.add_argument("--context", type=int, nargs="+", default=[2048])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--tasks", nargs="+", default=["passkey", "kv"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--generate", action="store_true", help="decode with model.generate instead")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"],
                    help="attention implementation (sdpa: same math, much faster and leaner at 8K on the CPU)")
    ap.add_argument("--batch", type=int, default=4, help="samples per forward pass")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype),
                                                 attn_implementation=args.attn).eval()
    res = {"model": args.model, "dtype": args.dtype, "attn": args.attn, "samples": args.samples, "seed": args.seed,
           "accuracy": {}}
    for task in args.tasks:
        for ctx in args.context:
            acc = needle_accuracy(model, ctx, args.samples, args.seed, task, batch=args.batch, generate=args.generate)
            res["accuracy"][f"{task}@{ctx}"] = acc
            print(json.dumps({"task": task, "context": ctx, "accuracy": acc}), flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
