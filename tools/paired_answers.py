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

With --export METHOD it writes instead one runtime method's answers for one policy as the peers
harness writes its own (tools/peers_eval.py --out), so that docs/results-peers.md reports a method
only headwise's runtime runs (an eval baseline such as `snapkv-headwise-slots`) beside the peers:

    python3 tools/paired_answers.py --samples S.jsonl --tokens T.jsonl --export snapkv-headwise-slots \
        --policy P.yaml --eval-json E.json --out A.jsonl

Its bytes are the global layers' (as the harness counts them), from the eval's JSON: kept and held =
the method's global K/V plus its measured bookkeeping, prefill peak = that plus the prompt K/V it
staged at once.
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


def global_bytes(eval_json, policy, method):
    """(kept, peak) bytes of the global layers for one method of one policy's evaluation."""
    try:
        doc = json.loads(pathlib.Path(eval_json).read_text())
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{eval_json}: {e}")
    evaluations = doc.get("evaluations", [doc])
    evaluation = next((e for e in evaluations if e.get("policy") == policy), None)
    if evaluation is None:
        fail(f"{eval_json}: no evaluation of --policy {policy}")
    m = next((m for m in evaluation["methods"] if m["name"] == method), None)
    if m is None:
        fail(f"{eval_json}: {policy} has no method {method} (not run, or not fitting its bytes)")
    details = m.get("details", {})
    kept = m["global_kv_bytes"] + details.get("auxiliary_bytes_measured", 0)
    return kept, kept + details.get("prefill_staged_peak_bytes_measured", 0)


def export(args, keys):
    """One runtime method's answers for one policy, in the peers harness's format."""
    label = f"{pathlib.Path(args.policy).stem}:{args.export}"
    rows = runtime_rows(args.tokens, keys).get(label, {})
    if set(rows) != set(keys):
        fail(f"{args.tokens}: {label} answered {len(rows)} samples, not the {len(keys)} of {args.samples}")
    kept, peak = global_bytes(args.eval_json, args.policy, args.export)
    lines = [json.dumps({"method": args.export, "task": task, "index": index, "right": rows[(task, index)]["right"],
                         "generated": rows[(task, index)]["generated"], "kept_bytes": kept, "held_bytes": kept,
                         "prefill_peak_bytes": peak}) for task, index in sorted(rows)]
    tmp = pathlib.Path(args.out + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(args.out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", required=True, help="eval --write-samples' file")
    p.add_argument("--tokens", required=True, help="eval --write-tokens' file")
    p.add_argument("--answers", action="append", default=[], help="tools/peers_eval.py --out files")
    p.add_argument("--against", help="the label every other method is paired with")
    p.add_argument("--export", help="write this runtime method's answers in the peers harness's format")
    p.add_argument("--policy", help="with --export: the policy file whose method is written, as eval named it")
    p.add_argument("--eval-json", help="with --export: eval --json's output of the same run")
    p.add_argument("--out", help="with --export: the answers file to write")
    args = p.parse_args()
    keys = sample_keys(read_jsonl(args.samples))
    if args.export:
        missing = [f"--{n.replace('_', '-')}" for n in ("policy", "eval_json", "out") if not getattr(args, n)]
        if missing:
            fail(f"--export needs {', '.join(missing)}")
        export(args, keys)
        return
    if not args.against:
        fail("--against (or --export) is required")
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
