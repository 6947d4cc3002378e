#!/usr/bin/env python3
"""Tokens/s of headwise's C++ tokenizer against Hugging Face `tokenizers`, side by side.

Repeats tests/tokenize/corpus.txt to about --megabytes MB, encodes the whole text in one
call on each side (no batching, so `tokenizers` runs on one thread like the C++ code; best
of --rounds), checks both produce the same number of tokens, and prints JSON.

Usage: tools/bench_tokenizer.py [--cli build/bin/headwise-calc] [--megabytes 4] [--rounds 3]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizers"


def bench_python(tokenizer_json, text, rounds):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_json))
    best, tokens = float("inf"), 0
    for _ in range(rounds):
        start = time.perf_counter()
        tokens = len(tok.encode(text, add_special_tokens=False).ids)
        best = min(best, time.perf_counter() - start)
    return {"tokens": tokens, "seconds": best, "tokens_per_second": tokens / best}


def bench_cpp(cli, tokenizer_json, path, rounds):
    out = subprocess.run([cli, "tokenize-bench", "--tokenizer", str(tokenizer_json), "--input", str(path),
                          "--rounds", str(rounds)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", default=str(ROOT / "build" / "bin" / "headwise-calc"))
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"  # keep `tokenizers` single-threaded, like our encode
    import tokenizers
    with open(ROOT / "tests" / "tokenize" / "corpus.txt", encoding="utf-8", newline="") as f:
        corpus = f.read()
    text = corpus * max(1, int(args.megabytes * 1e6 / len(corpus.encode("utf-8"))))
    results = {"tokenizers_version": tokenizers.__version__, "bytes": len(text.encode("utf-8")), "tokenizers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "bench.txt"
        path.write_bytes(text.encode("utf-8"))
        for folder in sorted(p for p in FIXTURES.iterdir() if (p / "tokenizer.json").exists()):
            py = bench_python(folder / "tokenizer.json", text, args.rounds)
            cpp = bench_cpp(args.cli, folder / "tokenizer.json", path, args.rounds)
            if py["tokens"] != cpp["tokens"]:
                sys.exit(f"bench_tokenizer: {folder.name}: token counts differ ({cpp['tokens']} vs {py['tokens']})")
            results["tokenizers"][folder.name] = {
                "tokens": cpp["tokens"], "cpp_tokens_per_second": round(cpp["tokens_per_second"]),
                "hf_tokens_per_second": round(py["tokens_per_second"]),
                "ratio_cpp_over_hf": round(cpp["tokens_per_second"] / py["tokens_per_second"], 3)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
