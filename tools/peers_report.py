#!/usr/bin/env python3
"""Writes docs/results-peers.md from the answers of tools/peers_eval.py (tools/make_results_peers.sh).

    python3 tools/peers_report.py --out docs/results-peers.md --meta out/peers/meta.json

meta.json (written by make_results_peers.sh) names the model, the commands, and for each budget
the policy, its bytes (mem-estimate), the presses' token budget and the answer files. Every
accuracy has its 95% Wilson interval; every method is compared with headwise on the same samples
(paired: the accuracy difference with its 95% Wald interval, and the exact two-sided McNemar p).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from results_report import Z, decisions, keep_rules_asked, read_policy, wilson, write_atomically  # noqa: E402

# What each press selects by: why it wins or loses against static windows on a retrieval task.
SELECTS_BY = {
    "kvpress:snapkv": "it selects by the attention of the prompt's last 64 queries, the question among them, over "
                      "the uncompressed prompt",
    "kvpress:pyramidkv": "it selects as SnapKV does (the question among the observing queries), with pyramidal "
                         "per-layer budgets",
    "kvpress:adakv-snapkv": "it selects as SnapKV does, with budgets shared across a layer's heads",
    "kvpress:tova": "it selects by the last prompt query's attention (the question's) over the uncompressed prompt",
    "kvpress:expected": "it selects without the question: by the attention future queries are expected to pay "
                        "(statistics of the prompt's queries), which in the layers that retrieve evicts the needle "
                        "and the question (docs/peers-expected-attention.md: a 0 there is the press's own selection, "
                        "and its first answer token comes from the uncompressed prefill)",
    "kvpress:adakv-expected": "it selects without the question: by the attention future queries are expected to "
                              "pay, with budgets shared across a layer's heads, which in the layers that retrieve "
                              "evicts the needle and the question (docs/peers-expected-attention.md: a 0 there is "
                              "the press's own selection, and its first answer token comes from the uncompressed "
                              "prefill)",
    "kvpress:knorm": "it selects without the question: by the keys' norms",
    "kvpress:streamingllm": "it keeps by position only (4 sinks and the most recent tokens)",
    "snapkv-headwise-slots": "the ablation: SnapKV's selection as published (the prompt's last 32 queries, the "
                             "question among them) on every head, each with the policy's own slots, in headwise's "
                             "runtime",
}
NOT_RUN = [
    ("DuoAttention (kvpress `DuoAttentionPress`)",
     "its head patterns are downloaded from the authors' repository for the models they trained, and its "
     "on-the-fly scoring loads the `kmfoda/booksum` dataset from the Hugging Face hub: neither is reachable "
     "here (no network at run time). headwise's own DuoAttention (trained gates, 128 sinks + 256 recent) is "
     "in docs/results.md"),
    ("KVzip (kvpress `KVzipPress`)",
     "kvpress 0.5.5 refuses it for this architecture (`KVzipPress is not supported for Gemma3ForCausalLM`), "
     "and its context reconstruction prompts the model with English text this 512-token model cannot read"),
    ("KVzap (kvpress `KVzapPress`)",
     "it scores keys with a small network trained per model (`nvidia/KVzap-*` on the hub); none exists for "
     "this model and none can be downloaded here"),
]


def indexed_by_task(samples):
    """(index within its task, sample): the key answers are written (tools/peers_eval.py) and paired under."""
    seen = {}
    for s in samples:
        seen[s["task"]] = seen.get(s["task"], -1) + 1
        yield seen[s["task"]], s


def read_answers(paths, only=None):
    by_method = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if only is None or r["method"] in only:
                    by_method.setdefault(r["method"], {})[(r["task"], r["index"])] = r
    return by_method


def intro(meta):
    b = next(iter(meta["budgets"].values()))
    return [
        f"Model `{meta['model']}` (the Gemma-3 layout: sliding-window layers between {b['global_layers']} "
        "global ones; how it was trained is in its README). Samples: headwise's own eval samples "
        f"(`headwise-calc eval --write-samples`, seed {meta['seed']}, {meta['samples_per_task']} per task, "
        f"{meta['context']} tokens), the same for every method. Tasks and scoring as in docs/results.md: the "
        "greedy answer must equal the answer's tokens exactly (for `needle_chain`, every hop's value, each "
        "later query fed with the model's own previous answer).",
        "",
        f"- **kvpress {meta['kvpress_version']}** (NVIDIA's library of presses, PyPI, in its own environment "
        f"with transformers {meta['kvpress_transformers']}): its presses, constructed with their defaults "
        "and a compression ratio that keeps the tokens the policy's bytes pay for. kvpress runs one way: "
        "the whole prompt in one forward under full attention, each global layer's cache compressed at "
        "the end of that layer's forward, then decoding without compression. The question at the prompt's "
        "end is in the observation window of the attention-based presses, as in their papers. The first "
        "answer token is therefore computed before anything is compressed (column \"first answer "
        "token\"); every later one needs what the press kept.",
        "- **headwise** in transformers through `HeadwiseCache` (python/headwise_hf, transformers as pinned), "
        "prefilled in 256-token chunks as a serving engine prefills, its bytes measured after every chunk (a "
        "chunk's own keys are activations, for every method): its window and h2o heads never hold more than "
        "their slots; its snap heads (docs/keep-rules.md) stage the prompt's K/V until the prompt's end and then "
        "keep their slots, so a policy with snap heads peaks above its bytes during prefill (column \"prefill "
        "peak\").",
        "- **Ablations**, marked so: `unconditioned`, the policy's calibration rerun with `--no-conditioning`; "
        "`snapkv-headwise-slots`, SnapKV's rule on the policy's own slots per head, run by headwise's runtime "
        "decoder (`headwise-calc eval --baselines snapkv-headwise-slots --write-tokens`) on the same samples, "
        "every answer checked against its sample's prompt (tools/paired_answers.py --export); its bytes are "
        "the runtime's measured ones, its bookkeeping on top of the policy's slots.",
        "- **Equal bytes.** Every byte is counted in bfloat16, the policy's KV dtype (all methods compute in "
        "float32; headwise's rings store bfloat16 K/V as its policy says, the others keep float32 "
        "tensors). A press keeps, per KV head and global layer, the policy's bytes divided by one token's "
        "K and V, rounded down, its bookkeeping included: the press gets the bytes the policy spends on "
        "its selecting (h2o, snap) heads' positions and scores as K/V, since it keeps no bookkeeping after prefill.",
        "- **Peaks.** A pruning press holds, while it prefills, the compressed caches of the layers below "
        "plus the whole prompt's K/V of the layer it compresses (its prefill peak, measured). "
        "**kvpress masks keys rather than freeing them** for the presses that give heads different "
        "budgets (AdaKV): the cache keeps every prompt key and the attention substitutes a key whose "
        "weight underflows to zero at the masked ones (`kvpress/attention_patch.py`: \"does not reduce "
        "peak memory\"). Such a press keeps the policy's bytes in what attention can see, and holds full "
        "KV in memory from prefill to the last generated token: shown as held, (over).",
        "- **Adaptations, and why.** (1) kvpress hooks every attention layer of a `Gemma3ForCausalLM`: its rule "
        "to skip the sliding layers is written for `Gemma3ForConditionalGeneration` only. Here the press's "
        "own forward hook runs on the global layers only, as kvpress does for the multimodal Gemma 3. "
        "(2) Gemma 3's rotary embedding takes the layer type; ExpectedAttention calls "
        "`module.rotary_emb(x, positions)` without it, which raises: it gets the global layers' own table. "
        "(3) Unchanged but worth knowing: kvpress's SnapKV-family window attention and ExpectedAttention "
        "scale logits by 1/sqrt(head_dim) (32 here: 0.18), where this model's attention scales by "
        "query_pre_attn_scalar^-1/2 (0.5; released Gemma 3 has the scalar equal to head_dim at most sizes), "
        "so those presses score with a softer softmax than the model attends with.",
        "- headwise's own re-implementations of these methods on the default model are in "
        "docs/results.md; this page runs the peers' code.",
    ]


def paired(a, b, keys):
    only_a = sum(a[k]["right"] and not b[k]["right"] for k in keys)
    only_b = sum(b[k]["right"] and not a[k]["right"] for k in keys)
    n = len(keys)
    diff = (only_a - only_b) / n
    half = Z * math.sqrt(max(0.0, (only_a + only_b) - (only_a - only_b) ** 2 / n)) / n
    d = only_a + only_b
    p = 1.0
    if d:
        tail = sum(math.comb(d, i) for i in range(min(only_a, only_b) + 1)) / 2 ** d
        p = min(1.0, 2 * tail)
    return diff, (diff - half, diff + half), p, only_a, only_b


def first_token_right(rows, keys, samples):
    """Share of samples whose first answer token is right: a press computes it in its prefill
    forward, under full attention, before anything is compressed."""
    return sum(rows[k]["generated"][0] == samples[k]["answer"][0] for k in keys) / len(keys)


def accuracy(rows, keys):
    right = sum(rows[k]["right"] for k in keys)
    return right / len(keys), wilson(right, len(keys))


def fmt_acc(acc, ci):
    return f"{acc:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def budget_section(share, b, answers, tasks, samples, absent=()):
    policy_bytes = b["policy_bytes"]
    head = answers["headwise"]
    keys = sorted(head)
    lines = [f"## Budget {share}% of full KV's global-KV bytes", ""]
    policy = read_policy(b["policy"])
    lines.append(
        f"Policy `{b['policy']}` ({keep_rules_asked(policy)}: {decisions(policy)}): global K/V {b['policy_kv_bytes']:,} bytes plus "
        f"{b['policy_selection_bytes']:,} bytes of its selecting heads' positions and scores = **{policy_bytes:,} "
        f"bytes** of {b['full_kv_bytes']:,} "
        f"for full KV (bfloat16, context {b['context']}). Each press keeps {b['keep_tokens']:,} K/V tokens per KV "
        f"head and global layer ({b['keep_tokens'] * b['token_bytes'] * b['global_kv_heads']:,} bytes: at most the "
        f"policy's bytes, its bookkeeping included). {len(keys) // len(tasks)} samples per task.")
    lines.append("")
    header = "| method | kept after prefill | held by the cache | prefill peak | " + " | ".join(tasks) + \
             " | mean | first answer token | headwise − method (95% CI) | McNemar p |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    order = (["headwise", "full"] + sorted(m for m in answers if m.startswith("kvpress:")) + ["unconditioned"]
             + sorted(m for m in answers if m.endswith("-headwise-slots")))
    verdicts = []
    for m in order:
        if m not in answers:
            continue
        rows = answers[m]
        if sorted(rows) != keys:
            sys.exit(f"peers_report: {m} answered other samples than headwise at {share}%")
        kept, held, peak = (max(r[f] for r in rows.values()) for f in ("kept_bytes", "held_bytes", "prefill_peak_bytes"))
        over = lambda x: f"{x:,}" + (" (over)" if x > policy_bytes else "")  # noqa: E731
        per_task = [fmt_acc(*accuracy(rows, [k for k in keys if k[0] == t])) for t in tasks]
        acc, ci = accuracy(rows, keys)
        if m == "headwise":
            cmp, p_text = "", ""
        else:
            diff, dci, p, _, _ = paired(head, rows, keys)
            cmp, p_text = f"{diff:+.3f} [{dci[0]:+.3f}, {dci[1]:+.3f}]", f"{p:.3g}"
            verdicts.append((m, acc, diff, dci, p, kept, held, peak))
        name = m + (" (ablation: --no-conditioning)" if m == "unconditioned" else
                    " (ablation)" if m.endswith("-headwise-slots") else "")
        lines.append(f"| {name} | {kept:,} | {over(held)} | {over(peak)} | " + " | ".join(per_task) +
                     f" | **{acc:.3f}** [{ci[0]:.2f}, {ci[1]:.2f}] | {first_token_right(rows, keys, samples):.2f} "
                     f"| {cmp} | {p_text} |")
    lines.append("")
    # Two verdicts: within the policy's bytes at every moment (the prefill peak fits), and within
    # them after prefill only (the steady bytes fit: a decode node under disaggregated prefill).
    head_held, head_peak = (max(r[f] for r in head.values()) for f in ("held_bytes", "prefill_peak_bytes"))
    measured = [("headwise", head_held, head_peak)] + [(m, held, peak) for m, *_, held, peak in verdicts
                                                          if m != "full"]
    shown = lambda m: "headwise" if m == "headwise" else f"`{m}`"  # noqa: E731
    within = [shown(m) for m, held, peak in measured if held <= policy_bytes and peak <= policy_bytes]
    after_prefill = [shown(m) for m, held, peak in measured if held <= policy_bytes < peak]
    over_budget = [shown(m) for m, held, peak in measured if held > policy_bytes]
    lines.append(f"Within the policy's {policy_bytes:,} bytes at every moment of prefill and decoding: "
                 + (", ".join(within) or "none") + ". Within them after prefill only (the steady bytes fit, "
                 "what a decode node holds under disaggregated prefill; the prompt staged above them): "
                 + (", ".join(after_prefill) or "none") + ". Over them after prefill too: "
                 + (", ".join(over_budget) or "none") + ".")
    lines.append("")
    head_acc = accuracy(head, keys)[0]
    for m, acc, diff, dci, p, kept, held, peak in verdicts:
        if m in ("full", "unconditioned"):
            continue
        if held > kept:
            where = "it keeps every prompt key in memory (masked, not freed), so it holds full KV from prefill on"
        elif peak > policy_bytes:
            staged = ("every global layer's whole prompt K/V, staged until the prompt's end" if not m.startswith("kvpress:")
                      else "the whole prompt's K/V of the layer it compresses")
            where = f"its prefill peak is {peak:,} bytes ({peak / policy_bytes:.2f}x the policy's: {staged})"
        else:
            where = "it holds the policy's bytes at every moment"
        scores = f"headwise {head_acc:.3f}, {m} {acc:.3f} ({diff:+.3f} [{dci[0]:+.3f}, {dci[1]:+.3f}], p = {p:.3g})"
        if m in SELECTS_BY:
            where = SELECTS_BY[m] + "; " + where
        if p >= 0.05:
            lines.append(f"- `{m}` ties: {scores}; {where}.")
        elif diff > 0:
            lines.append(f"- headwise leads `{m}`: {scores}; {where}.")
        else:
            lines.append(f"- `{m}` **wins**: {scores}; {where}.")
    if "unconditioned" in answers:
        diff, dci, p, only_h, only_u = paired(head, answers["unconditioned"], keys)
        lines.append(f"- Conditioning: conditioned − unconditioned = {diff:+.3f} [{dci[0]:+.3f}, {dci[1]:+.3f}] "
                     f"(right only conditioned {only_h}, only unconditioned {only_u}; McNemar p = {p:.3g}).")
    if absent:
        lines.append("- Not run at this budget (run at another): " + ", ".join(f"`{m}`" for m in sorted(absent)) +
                     "; the commands below are the ones that ran.")
    if "full" in answers and "full@kvpress" in answers:
        full, other = answers["full"], answers["full@kvpress"]
        same = sum(full[k]["generated"] == other[k]["generated"] for k in keys)
        lines.append(f"- Full KV in kvpress's environment "
                     f"generates the same tokens as in headwise's on {same} of {len(keys)} samples.")
    lines.append("")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    meta = json.load(open(args.meta))
    with open(meta["samples"]) as f:
        samples = {(s["task"], i): s for i, s in indexed_by_task(json.loads(line) for line in f)}
    tasks = list(dict.fromkeys(task for task, _ in samples))  # in the samples' order
    out = [f"# Results against the field's own implementations: {meta['model_name']}", "",
           "Generated by `tools/make_results_peers.sh`; do not edit by hand.", ""]
    out += intro(meta) + [""]
    answered = {share: read_answers(b["answers"]) for share, b in meta["budgets"].items()}
    everywhere = {m for a in answered.values() for m in a if m.startswith("kvpress:")}
    for share, b in meta["budgets"].items():
        answers = answered[share]
        absent = everywhere - set(answers)
        answers.update(read_answers(b["full_answers"], only=("full", "full@kvpress")))
        out += budget_section(share, b, answers, tasks, samples, absent)
    # The presses tools/make_results_peers.sh runs by default (meta.json), as peers_eval.py names them.
    default_presses = ["kvpress:" + p for p in meta.get("default_presses", "").split(",") if p]
    left_out = [m for m in default_presses if not any(m in a for a in answered.values())]
    out += ["## Not run, and why", ""] + [f"- {name}: {why}." for name, why in NOT_RUN]
    if left_out:
        out.append("- Left out of this regeneration (`PRESSES`), though tools/make_results_peers.sh runs them by "
                   "default: " + ", ".join(f"`{m}`" for m in left_out) + "; an earlier regeneration in this file's "
                   "history has them.")
    out += [""]
    out += ["## Commands", "", "```"] + meta["commands"] + ["```", ""]
    write_atomically(args.out, "\n".join(out))


if __name__ == "__main__":
    main()
