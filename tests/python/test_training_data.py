#!/usr/bin/env python3
"""The training generators (tools/train_default_model.py) write needles and chains in the layout
`headwise-calc eval` answers, so a model trained on them is tested on the format it learned.

Compares `eval --write-samples` (the C++ tasks: src/tasks/synthetic.cpp, src/eval/tasks.cpp) with
tdm.sample_needles and tdm.sample_chain at the same length: the marker, separator and content ids,
the needle and query layout, each query's answer, and for chains the links (each key the first
two tokens of the previous value), the planting (each needle once in the haystack) and the
answer's sources (generated values, given marker and separator, keys copied from the previous
value). Needs numpy only, no torch.

    test_training_data.py --cli build/bin/headwise-calc --models models --policies policies
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import train_default_model as tdm  # noqa: E402
from checklist import Checklist  # noqa: E402  (this folder)

GENERATED, GIVEN = -1, -2  # EvalSample::answer_source (include/headwise/eval/tasks.hpp)
KEY_LEN, VALUE_LEN = 2, 3
QUERY_LEN = 2 + KEY_LEN + VALUE_LEN


def eval_samples(cli, model, policy, seed):
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "samples.jsonl"
        subprocess.run([cli, "eval", "--model", model, "--policy", policy, "--samples", "4", "--seed",
                        str(seed), "--write-samples", str(path), "--quiet"], check=True)
        return [json.loads(line) for line in path.read_text().splitlines()]


def chain_links(queries):
    """(key, value) of each query of a chain's tail, checking the marker and separator."""
    out = []
    for q in queries:
        assert q[0] == tdm.MARKER and q[1 + KEY_LEN] == tdm.SEP, q
        out.append((q[1:1 + KEY_LEN], q[2 + KEY_LEN:]))
    return out


def planted(tokens, key, value):
    """How often MARKER key SEP value occurs in tokens."""
    needle = [tdm.MARKER, *key, tdm.SEP, *value]
    return sum(tokens[i:i + len(needle)] == needle for i in range(len(tokens) - len(needle) + 1))


def answer_sources(hops):
    """The eval's answer_source of a chain of `hops` queries (src/eval/tasks.cpp chain_sample)."""
    src = []
    for hop in range(hops):
        if hop > 0:
            previous = len(src) - VALUE_LEN
            src += [GIVEN, previous, previous + 1, GIVEN]
        src += [GENERATED] * VALUE_LEN
    return src


def check_chain(tokens, hops, check, who):
    tail = tokens[len(tokens) - hops * QUERY_LEN:]
    links = chain_links([tail[i:i + QUERY_LEN] for i in range(0, len(tail), QUERY_LEN)])
    check(all(links[h][0] == links[h - 1][1][:KEY_LEN] for h in range(1, hops)),
          f"{who}: each key is the first {KEY_LEN} tokens of the previous value")
    haystack = tokens[:len(tokens) - hops * QUERY_LEN]
    check(all(planted(haystack, k, v) == 1 for k, v in links), f"{who}: every needle is planted once")
    check(all(t >= tdm.CONTENT0 for k, v in links for t in (*k, *v)), f"{who}: keys and values are content ids")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--policies", default=str(ROOT / "policies"))
    args = ap.parse_args()
    check = Checklist()

    model = str(pathlib.Path(args.models) / "tiny-qwen3-next")
    policy = str(pathlib.Path(args.policies) / "tiny-qwen3-next-eval-2k-25.yaml")
    samples = eval_samples(args.cli, model, policy, 5)
    chains = [s for s in samples if s["task"] == "needle_chain"]
    singles = [s for s in samples if s["task"] == "needle_single"]
    check(len(chains) == 4 and len(singles) == 4, "eval wrote 4 samples of needle_chain and of needle_single")
    T = len(chains[0]["prompt"]) + len(chains[0]["answer"])
    hops = len(chains[0]["answer"]) // QUERY_LEN + 1

    for i, s in enumerate(chains):
        check_chain(s["prompt"] + s["answer"], hops, check, f"eval chain {i}")
        check(s["answer_source"] == answer_sources(hops), f"eval chain {i}: answer sources are chain_sample's")

    rng = np.random.default_rng([7, 0])
    for i in range(4):
        tokens, weights, positions = tdm.sample_chain(rng, T, hops)
        who = f"tdm.sample_chain {i}"
        # Training samples start with BOS inside their T tokens; eval's carry no BOS (the tokenizer
        # adds none), so the layouts are compared from the end, where the queries are.
        check(len(tokens) == T and tokens[0] == tdm.BOS, f"{who}: {T} tokens, as eval's samples, BOS first")
        check_chain(tokens, hops, check, who)
        first = positions[0]
        sources = [GENERATED if p in positions else GIVEN for p in range(first, T)]
        expected = [GENERATED if x == GENERATED else GIVEN for x in answer_sources(hops)]  # copied keys are given
        check(sources == expected, f"{who}: the answer positions are eval's generated tokens")
        check(all(weights[p] == tdm.ANSWER_WEIGHT for p in positions)
              and sum(w == tdm.ANSWER_WEIGHT for w in weights) == len(positions),
              f"{who}: exactly the answer tokens are weighted")
        check(first == T - hops * QUERY_LEN + 2 + KEY_LEN and tokens[first - 1] == tdm.SEP,
              f"{who}: the prompt ends with the first query's separator, as eval's")

    for i, s in enumerate(singles):
        tokens = s["prompt"] + s["answer"]
        key, value = chain_links([tokens[-QUERY_LEN:]])[0]
        check(planted(tokens[:-QUERY_LEN], key, value) == 1 and s["answer"] == value,
              f"eval single {i}: one needle, queried at the end, the value its answer")
    tokens, _, queries = tdm.sample_needles(rng, T, 1)
    (start, value), = queries
    key, planted_value = chain_links([tokens[-QUERY_LEN:]])[0]
    check(start == T - VALUE_LEN and planted_value == value and planted(tokens[:-QUERY_LEN], key, value) == 1,
          "tdm.sample_needles: one needle, queried at the end with eval's layout")

    return check.exit_status()


if __name__ == "__main__":
    sys.exit(main())
