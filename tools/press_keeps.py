#!/usr/bin/env python3
"""What a kvpress press keeps of what the answer needs: per global layer, the share of the needle's
value tokens (those after the question's key where the haystack plants it) and of the question's
(the prompt's last --question-tokens tokens) that the press keeps, over headwise's eval samples.

Made to find why `kvpress:adakv-expected` scores 0.000 in docs/results-peers.md while its first
answer token is right (docs/peers-expected-attention.md). A right answer needs the needle's value
tokens in the layers that retrieve it; a press that keeps them no more often than chance cannot
answer, whatever its harness.

    .venv-kvpress/bin/python tools/press_keeps.py --model models/tiny-gemma3-8k \\
        --samples S.jsonl --keep-tokens 1007 --presses expected,snapkv,streamingllm

Prints one line per press: the shares by global layer.
"""
import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peers_eval  # noqa: E402  (the harness whose presses are measured)


def needle_positions(sample, question_tokens, value_tokens=3):
    """The needle's value tokens: the `value_tokens` after each earlier occurrence of the question
    (a needle reads MARKER key SEP value, and its query MARKER key SEP: tasks/synthetic.hpp)."""
    prompt = sample["prompt"]
    question = prompt[len(prompt) - question_tokens:]
    positions = set()
    for i in range(len(prompt) - 2 * question_tokens):
        if prompt[i:i + question_tokens] == question:
            positions |= set(range(i + question_tokens, i + question_tokens + value_tokens))
    return positions


def kept_positions(model, press, layers, prompt):
    """Per global layer, per KV head: the prompt positions the press keeps (its top scores)."""
    from transformers import DynamicCache

    scores = {}
    score = press.score

    def recording(module, *args):
        s = score(module, *args)
        scores[module.layer_idx] = s.detach()
        return s

    press.score = recording
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), peers_eval.press_on_global_layers(press, model, layers, [0]):
        peers_eval.next_token(model, cache, prompt, 0)
    kept = {}
    for layer in layers:
        n = cache.layers[layer].keys.shape[2]
        kept[layer] = [set(h.tolist()) for h in scores[layer][0].topk(n, dim=-1).indices]
    return kept


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", required=True, help="JSON lines of `headwise-calc eval --write-samples`")
    ap.add_argument("--keep-tokens", type=int, required=True, help="K/V tokens each press keeps per KV head")
    ap.add_argument("--presses", required=True, help="comma-separated kvpress scorers (peers_eval.PRESSES)")
    ap.add_argument("--question-tokens", type=int, default=4,
                    help="the prompt's last tokens that are its question (headwise's eval: MARKER key key SEP)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    samples = peers_eval.read_samples(args.samples)
    presses = [p for p in args.presses.split(",") if p]
    for p in presses:
        if p.startswith("adakv-") or p not in peers_eval.PRESSES:
            peers_eval.fail(f"--presses {p}: not a scorer press (have: "
                            f"{', '.join(x for x in peers_eval.PRESSES if not x.startswith('adakv-'))})")
    if not 0 < args.keep_tokens < min(len(s["prompt"]) for s in samples):
        peers_eval.fail(f"--keep-tokens must be between 1 and the shortest prompt's length, got {args.keep_tokens}")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager").eval()
    layers = peers_eval.global_layers(model)
    for name in presses:
        needle = {layer: [0, 0] for layer in layers}
        question = {layer: [0, 0] for layer in layers}
        for sample in samples:
            prompt = sample["prompt"]
            press = peers_eval.make_press(name, 1.0 - (args.keep_tokens + 0.5) / len(prompt))
            wanted = needle_positions(sample, args.question_tokens)
            asked = set(range(len(prompt) - args.question_tokens, len(prompt)))
            for layer, heads in kept_positions(model, press, layers, prompt).items():
                for kept in heads:
                    needle[layer][0] += len(wanted & kept)
                    needle[layer][1] += len(wanted)
                    question[layer][0] += len(asked & kept)
                    question[layer][1] += len(asked)
        share = lambda counts: ", ".join(f"{layer}: {a / b:.2f}" for layer, (a, b) in counts.items())  # noqa: E731
        print(json.dumps({"press": name, "keep_tokens": args.keep_tokens, "samples": len(samples),
                          "needle_kept_by_layer": share(needle), "question_kept_by_layer": share(question)}),
              flush=True)


if __name__ == "__main__":
    main()
