#!/usr/bin/env python3
"""`mem-estimate --prometheus` parses back (text exposition format 0.0.4) to what --json says.

Usage: test_prometheus.py --cli build/bin/headwise-calc
"""
import argparse
import json
import math
import pathlib
import re
import subprocess
import sys
import tempfile

from checklist import Checklist  # this folder

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)\}})? (\S+)$")


def unescape(v):
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def parse(text):
    """{(name, frozenset(labels)): value}, checking the format strictly."""
    assert text.endswith("\n"), "exposition text must end with a newline"
    types, helps, samples = {}, {}, {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# HELP "):
            name, help_ = line[7:].split(" ", 1)
            assert name not in helps, f"line {n}: second HELP for {name}"
            helps[name] = help_
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind == "gauge" and name not in types, f"line {n}: {line}"
            types[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"line {n} is not a sample: {line!r}"
            name = m.group(1)
            assert name in types and name in helps, f"line {n}: {name} before its HELP/TYPE"
            labels = {k: unescape(v) for k, v in re.findall(LABEL, m.group(2) or "")}
            value = float(m.group(m.lastindex))
            key = (name, frozenset(labels.items()))
            assert key not in samples, f"line {n}: duplicate series"
            samples[key] = value
    return samples


def series(samples, name, **match):
    return {dict(k[1]).get("component") or (dict(k[1]).get("layer"), dict(k[1]).get("head")): v
            for k, v in samples.items() if k[0] == name and all(dict(k[1]).get(a) == b for a, b in match.items())}


def run(cli, *args, ok=True):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    if ok and r.returncode != 0:
        sys.exit(f"FAIL {' '.join(map(str, args))}: {r.stderr.strip()}")
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    args = p.parse_args()
    check = Checklist()

    with tempfile.TemporaryDirectory(prefix="headwise-prom-") as d:
        # A model name that needs escaping, in a copy of a shipped policy.
        src = (ROOT / "policies" / "tiny-qwen3-next-eval-2k-25.yaml").read_text()
        src = src.replace('model_name: "tiny-qwen3-next"', r'model_name: "tiny \"qwen\" \\ next"')
        src = src.replace('model_path: "../models/tiny-qwen3-next"', f'model_path: "{ROOT / "models" / "tiny-qwen3-next"}"')
        policy = pathlib.Path(d) / "policy.yaml"
        policy.write_text(src)
        for extra, context, batch in (([], "2048", "1"), (["--context", "1k", "--batch", "3"], "1024", "3")):
            text = run(args.cli, "mem-estimate", "--config", policy, "--prometheus", *extra).stdout
            js = json.loads(run(args.cli, "mem-estimate", "--config", policy, "--json", *extra).stdout)
            try:
                samples = parse(text)
            except AssertionError as e:
                check(False, f"parse: {e}")
                continue
            common = {"model": 'tiny "qwen" \\ next', "context": context, "batch": batch}
            check(all(dict(k[1])["model"] == common["model"] for k in samples), "model label round-trips its escapes")
            total = series(samples, "headwise_cache_bytes", **common)
            check(list(total.values()) == [js["total_bytes"]], f"{extra}: total {total} == {js['total_bytes']}")
            comps = series(samples, "headwise_cache_component_bytes", **common)
            want = {k[:-len("_bytes")]: v for k, v in js["components"].items()}
            check(comps == want, f"{extra}: components {comps} == {want}")
            full = series(samples, "headwise_full_kv_cache_bytes", **common)
            check(list(full.values()) == [js["full_kv_total_bytes"]], f"{extra}: full KV {full}")
            windows = series(samples, "headwise_kv_window_size", **common)
            want_w = {}
            for layer in js["layers"]:
                for h, w in enumerate(layer["kv_head_windows"] or []):
                    want_w[(str(layer["layer_id"]), str(h))] = math.inf if w == "full" else float(w)
            check(windows == want_w and len(windows) == 8, f"{extra}: windows {windows}")
            check(len(samples) == len(windows) + 1 + 5 + 1, f"{extra}: no other series ({len(samples)})")
        r = run(args.cli, "mem-estimate", "--config", policy, "--prometheus", "--json", ok=False)
        check(r.returncode == 1 and "--prometheus" in r.stderr, f"--prometheus with --json: {r.stderr.strip()}")
        r = run(args.cli, "mem-estimate", "--config", policy, "--prometheus", "--engine", "vllm", ok=False)
        check(r.returncode == 1 and "--prometheus" in r.stderr, f"--prometheus with --engine vllm: {r.stderr.strip()}")
    return check.exit_status()


if __name__ == "__main__":
    sys.exit(main())
