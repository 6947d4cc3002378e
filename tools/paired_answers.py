#!/usr/bin/env python3
"""Pairs the answers of headwise's runtime (`eval --write-tokens`) with those of the peers harness
(`tools/peers_eval.py --out`) on the same samples (`eval --write-samples`), and prints a markdown
table: each method's accuracy per task and pooled (95% Wilson interval), and each method against
one of them (the accuracy difference with its 95% Wald interval on the paired differences, and the
exact two-sided McNemar p), as docs/results-peers.md computes them.

    python3 tools/paired_answers.py --samples S.jsonl --tokens T.jsonl [--answers A.jsonl ...] \\
        --against POLICY:headwise

A runtime row is labelled `<policy file stem>:<method>` (full KV: `full`); a peers row by its
method. Every runtime row must answer the prompt of its sample (its SHA-256 and length), so the
pairing is checked, not assumed.
"""
import argparse
import hashlib
import json
import os
import pathlib
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers_report import paired  # noqa: E402
from results_report import wilson  # noqa: E402


def fail(message):
    print(f"paired_answers: {message}", file=sys.stderr)
    sys.exit(2)


def read_jsonl(path):
    try:
        return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{path}: {e}")


def sample_keys(samples):
    """(task, index within the task) of each sample, in file order, with its prompt's SHA-256."""
    seen = defaultdict(int)
    keys = {}
    for s in samples:
        key = (s["task"], seen[s["task"]])
        seen[s["task"]] += 1
        keys[key] = (hashlib.sha256(",".join(map(str, s["prompt"])).encode()).hexdigest(), len(s["prompt"]))
    return keys


def runtime_rows(path, keys):
    rows = defaultdict(dict)
    for r in read_jsonl(path):
        key = (r["task"], r["index"])
        if keys.get(key) != (r["prompt_sha256"], r["prompt_tokens"]):
            fail(f"{path}: {r['method']} of {r['policy']} on {key} did not answer that sample's prompt")
        label = "full" if r["method"] == "full" else f"{pathlib.Path(r['policy']).stem}:{r['method']}"
        rows[label][key] = r
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", required=True, help="eval --write-samples' file")
    p.add_argument("--tokens", required=True, help="eval --write-tokens' file")
    p.add_argument("--answers", action="append", default=[], help="tools/peers_eval.py --out files")
    p.add_argument("--against", required=True, help="the label every other method is paired with")
    args = p.parse_args()
    keys = sample_keys(read_jsonl(args.samples))
    rows = runtime_rows(args.tokens, keys)
    for path in args.answers:
        for r in read_jsonl(path):
            rows[r["method"]][(r["task"], r["index"])] = r
    for label, by_key in rows.items():
        if set(by_key) != set(keys):
            fail(f"{label}: answered {len(by_key)} samples, not the {len(keys)} of {args.samples}")
    if args.against not in rows:
        fail(f"--against {args.against}: no such method (have {', '.join(sorted(rows))})")
    tasks = list(dict.fromkeys(task for task, _ in keys))
    order = sorted(keys)
    print("| method | " + " | ".join(tasks) + f" | mean [95%] | {args.against} − method [95%] | McNemar p |")
    print("|---" * (len(tasks) + 4) + "|")
    for label in [args.against] + sorted(set(rows) - {args.against}):
        by_task = [sum(rows[label][k]["right"] for k in order if k[0] == t) / sum(k[0] == t for k in order)
                   for t in tasks]
        right = sum(rows[label][k]["right"] for k in order)
        lo, hi = wilson(right, len(order))
        cells = [f"{a:.2f}" for a in by_task] + [f"**{right / len(order):.3f}** [{lo:.2f}, {hi:.2f}]"]
        if label == args.against:
            cells += ["", ""]
        else:
            diff, (dlo, dhi), pvalue, _, _ = paired(rows[args.against], rows[label], order)
            cells += [f"{diff:+.3f} [{dlo:+.3f}, {dhi:+.3f}]", f"{pvalue:.3g}"]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
