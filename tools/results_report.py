#!/usr/bin/env python3
"""Writes docs/results.md and docs/results.svg (or --out PREFIX .md/.svg) from the eval JSON files of tools/make_results.sh.

    python3 tools/results_report.py [--out PREFIX] MODEL SHARE POLICY CALIBRATE_CMD EVAL_CMD [SHARE POLICY ...]

reads out/results-SHARE.json for each share. Every accuracy is shown with its 95% Wilson interval,
KL and perplexity with their 95% intervals over samples; the plot shows mean task accuracy against
global-KV bytes per method.
"""
import json
import math
import os
import re
import sys

Z = 1.959963984540054
COLOURS = {"headwise": "#c0392b", "full": "#2c3e50", "uniform": "#2980b9", "streamingllm": "#5dade2",
           "pyramid-windows": "#8e44ad", "retrieval-score": "#27ae60", "duo": "#16a085", "random": "#7f8c8d",
           "unconditioned": "#e67e22", "snapkv": "#d35400", "h2o": "#f1c40f", "adakv": "#6d4c41",
           "pyramidkv": "#6c3483", "snapkv-chunked": "#e59866", "adakv-chunked": "#a1887f",
           "pyramidkv-chunked": "#bb8fce", "h2o-headwise-slots": "#f7dc6f", "snapkv-headwise-slots": "#f0b27a",
           "adakv-headwise-slots": "#bcaaa4", "snapkv-chunked-headwise-slots": "#fad7a0",
           "adakv-chunked-headwise-slots": "#d7ccc8"}
# Not methods as published: what they take away or change is the point.
ABLATIONS = ("unconditioned", "pyramid-windows")


def is_ablation(name):
    return name in ABLATIONS or name.endswith("-headwise-slots")


def shown_name(name):
    return name + " (ablation)" if is_ablation(name) else name


def bookkeeping_bytes(m):
    """Selection bookkeeping a method holds with its K/V (positions, scores, regions), measured."""
    return m.get("details", {}).get("auxiliary_bytes_measured", 0)


def staged_prompt_bytes(m):
    """Prompt K/V a method held beyond its cache at once, measured: SnapKV/AdaKV as published stage
    the whole prompt (and compute its logits at full attention); every other method, 0."""
    return m.get("details", {}).get("prefill_staged_peak_bytes_measured", 0)


def policy_cache_bytes(r):
    """What the policy holds: the bytes a method may hold at any moment to fit the same budget."""
    return next(m for m in r["methods"] if m["name"] == "headwise")["cache_bytes_measured"]


def prefill_peak(m):
    """Cache bytes plus the most prompt K/V the method held beyond them at once (measured)."""
    return m["cache_bytes_measured"] + staged_prompt_bytes(m)


def wilson(right, total):
    if total == 0:
        return 0.0, 1.0
    p = right / total
    centre = (p + Z * Z / (2 * total)) / (1 + Z * Z / total)
    half = Z * math.sqrt(p * (1 - p) / total + Z * Z / (4 * total * total)) / (1 + Z * Z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_accuracy(method, tasks):
    """Pooled over tasks (equal samples per task): right / total, with its Wilson interval."""
    right = sum(method["tasks_counts"][t]["right"] for t in tasks)
    total = sum(method["tasks_counts"][t]["total"] for t in tasks)
    return right / total, wilson(right, total)


def table(r):
    tasks = r["tasks"]
    head = ["method", "global KV bytes", "of the cache: bookkeeping", "cache bytes est. = measured", "prefill peak"] + tasks + [
        "mean", "KL vs full (95% CI)", "perplexity (95% CI)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    budget = policy_cache_bytes(r)
    for m in r["methods"]:
        same = "yes" if m["cache_bytes_estimated"] == m["cache_bytes_measured"] else "**NO**"
        over = prefill_peak(m) > budget
        cells = [shown_name(m["name"]), f'{m["global_kv_bytes"]:,}', f'{bookkeeping_bytes(m):,}',
                 f'{m["cache_bytes_estimated"]:,} ({same})',
                 f'{prefill_peak(m):,}' + (" (over)" if over else "")]
        for t in tasks:
            lo, hi = m["tasks_ci95"][t]
            cells.append(f'{m["tasks"][t]:.2f} [{lo:.2f}, {hi:.2f}]')
        acc, (lo, hi) = mean_accuracy(m, tasks)
        cells.append(f'**{acc:.3f}** [{lo:.2f}, {hi:.2f}]')
        kl = f'{m["kl_vs_full"]:.4f} ± {m["kl_vs_full_ci95_half_width"]:.4f}'
        # SnapKV/AdaKV compute the prompt with full attention and compress after it.
        cells.append(kl + " (prompt at full KV)" if staged_prompt_bytes(m) > 0 else kl)
        ppl = m["perplexity_ci95"]
        cells.append(f'{m["perplexity"]:.3f} [{ppl[0]:.3f}, {ppl[1]:.3f}]' if ppl else f'{m["perplexity"]:.3f}')
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def eviction_bookkeeping(r):
    """The selecting methods' bytes beyond K/V: bookkeeping (in the cache bytes) and prompt staging (not)."""
    parts = []
    for m in r["methods"]:
        d = m.get("details", {})
        if "auxiliary_bytes_measured" in d:
            parts.append(f'{m["name"]} {d["auxiliary_bytes_measured"]:,} B'
                         + (f' (+{d["prefill_staged_peak_bytes_measured"]:,} B prompt K/V staged at the prefill peak)'
                            if d.get("prefill_staged_peak_bytes_measured") else ""))
    if not parts:
        return ""
    return ("Selection bookkeeping (a position and a score per slot, a region per head), measured, counted in each "
            "method's cache bytes: " + "; ".join(parts) + ".\n")


def verdict(r):
    """Where headwise stands against each baseline: by interval overlap, per task and on the mean."""
    tasks = r["tasks"]
    methods = {m["name"]: m for m in r["methods"]}
    hw = methods.get("headwise")
    if hw is None:
        return ""
    lines = []
    for name, m in methods.items():
        if name in ("headwise", "full"):
            continue
        parts = []
        for t in tasks + ["mean"]:
            if t == "mean":
                a, (alo, ahi) = mean_accuracy(hw, tasks)
                b, (blo, bhi) = mean_accuracy(m, tasks)
            else:
                a, (alo, ahi) = hw["tasks"][t], hw["tasks_ci95"][t]
                b, (blo, bhi) = m["tasks"][t], m["tasks_ci95"][t]
            if alo > bhi:
                word = "better"
            elif blo > ahi:
                word = "**worse**"
            elif a > b:
                word = "ahead, intervals overlap"
            elif a < b:
                word = "behind, intervals overlap"
            else:
                word = "tied"
            parts.append(f"{t}: {word} ({a:.2f} vs {b:.2f})")
        lines.append(f"- vs **{shown_name(name)}**: " + "; ".join(parts))
        paired = r.get("paired_vs_headwise", {}).get(name)
        if paired:
            lo, hi = paired["accuracy_difference_ci95"]
            lines.append(
                f"  - paired on the same {paired['samples']} samples: accuracy headwise − {name} = "
                f"{paired['accuracy_difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] (right only with headwise "
                f"{paired['right_only_first']}, only with {name} {paired['right_only_second']}; exact McNemar "
                f"p = {paired['mcnemar_p']:.3g}); KL headwise − {name} = {paired['kl_difference']:+.4f} "
                f"± {paired['kl_difference_ci95_half_width']:.4f}")
    return "\n".join(lines)


def within_budget_summary(r):
    """The comparisons a fixed memory budget allows, as two verdicts: methods within the policy's
    bytes at every moment (the prefill peak: cache bytes, bookkeeping included, plus any prompt K/V
    staged), ranked by mean accuracy; methods within them after prefill only (their steady decode
    bytes fit, the staged prompt does not: what a decode node holds under disaggregated prefill,
    while the prefill node holds the peak); then the ones over them after prefill too, with by how
    much and why."""
    tasks = r["tasks"]
    budget = policy_cache_bytes(r)
    always, after_prefill, over = [], [], []
    for m in r["methods"]:
        if m["name"] == "full":
            continue
        acc, (lo, hi) = mean_accuracy(m, tasks)
        entry = (acc, m["name"], lo, hi, prefill_peak(m), m)
        if prefill_peak(m) <= budget:
            always.append(entry)
        elif m["cache_bytes_measured"] <= budget:
            after_prefill.append(entry)
        else:
            over.append(entry)
    always.sort(key=lambda e: (-e[0], e[1]))
    after_prefill.sort(key=lambda e: (-e[0], e[1]))

    def label(n):
        return "**headwise**" if n == "headwise" else shown_name(n)

    def why(m):
        reasons = []
        if staged_prompt_bytes(m):
            reasons.append("its snap heads stage the prompt's K/V until they choose"
                           if m["name"] in ("headwise", "unconditioned") else "stages the whole prompt's K/V")
        if m["cache_bytes_measured"] > budget:
            reasons.append(f"holds {m['cache_bytes_measured'] - budget:,} B more than the policy throughout "
                           f"(bookkeeping on the policy's slots)")
        return " and ".join(reasons)

    def ranked(entries):
        return ", ".join(f"{label(n)} {a:.3f} [{lo:.2f}, {hi:.2f}]" for a, n, lo, hi, _, _ in entries) or "none"

    lines = [f"Within the policy's {budget:,} bytes at every moment of prefill and decode (K/V, bookkeeping and any "
             "staged prompt counted alike), by mean accuracy: " + ranked(always) + "."]
    if after_prefill:
        lines.append("Within them after prefill only (the steady decode bytes fit: what a decode node holds under "
                     "disaggregated prefill, where the prefill node holds the peak), by mean accuracy: "
                     + ", ".join(f"{label(n)} {a:.3f} [{lo:.2f}, {hi:.2f}] (peak {peak:,} bytes, {peak / budget:.2f}x: "
                                 f"{why(m)})" for a, n, lo, hi, peak, m in after_prefill) + ".")
    if over:
        lines.append("Over them after prefill too: "
                     + "; ".join(f"{shown_name(n)} {a:.3f} [{lo:.2f}, {hi:.2f}] at {peak:,} bytes ({peak / budget:.2f}x: "
                                 f"{why(m)})" for a, n, lo, hi, peak, m in sorted(over, key=lambda e: e[1])) + ".")
    lines.extend(not_run_lines(r))
    return "\n".join(lines)


def not_run_lines(r):
    """Requested methods with no configuration within the policy's bytes: eval did not run them."""
    missing = r.get("methods_not_fitting", [])
    if not missing:
        return []
    return ["Not run, no configuration of theirs fits the policy's bytes: "
            + "; ".join(f'{shown_name(m["name"])} ({m["reason"]})' for m in missing) + "."]


def svg(results):
    w, h, left, right, top, bottom = 640, 400, 70, 160, 30, 50
    points = []
    for share, r in results:
        for m in r["methods"]:
            acc, (lo, hi) = mean_accuracy(m, r["tasks"])
            points.append((m["name"], m["global_kv_bytes"], acc, lo, hi))
    xmax = max(p[1] for p in points) * 1.05
    sx = lambda x: left + (w - left - right) * x / xmax
    sy = lambda y: top + (h - top - bottom) * (1 - y)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="18" font-size="13">Mean accuracy over the tasks (95% Wilson) vs global-KV bytes</text>',
           f'<line x1="{left}" y1="{sy(0)}" x2="{w - right}" y2="{sy(0)}" stroke="black"/>',
           f'<line x1="{left}" y1="{sy(0)}" x2="{left}" y2="{sy(1)}" stroke="black"/>']
    for y in (0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<text x="{left - 8}" y="{sy(y) + 4}" text-anchor="end">{y:.2f}</text>')
        out.append(f'<line x1="{left}" y1="{sy(y)}" x2="{w - right}" y2="{sy(y)}" stroke="#ddd"/>')
    for x in range(0, int(xmax) + 1, max(1, int(xmax) // 4)):
        out.append(f'<text x="{sx(x)}" y="{h - bottom + 16}" text-anchor="middle">{x / 2**20:.2f} MiB</text>')
    names = []
    # Every method that ran at some budget (one that fits no configuration at a budget is absent there).
    ordered = list(dict.fromkeys(m["name"] for _, r in results for m in r["methods"]))
    for name in ordered:
        pts = sorted((p for p in points if p[0] == name), key=lambda p: p[1])
        colour = COLOURS.get(name, "#000")
        names.append((name, colour))
        if len(pts) > 1:
            path = " ".join(f"{sx(p[1]):.1f},{sy(p[2]):.1f}" for p in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for p in pts:
            out.append(f'<line x1="{sx(p[1]):.1f}" y1="{sy(p[3]):.1f}" x2="{sx(p[1]):.1f}" y2="{sy(p[4]):.1f}" '
                       f'stroke="{colour}"/>')
            out.append(f'<circle cx="{sx(p[1]):.1f}" cy="{sy(p[2]):.1f}" r="3.5" fill="{colour}"/>')
    for i, (name, colour) in enumerate(names):
        y = top + 16 * i + 10
        out.append(f'<rect x="{w - right + 15}" y="{y - 8}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{w - right + 30}" y="{y + 1}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def read_policy(policy_path):
    import yaml  # PyYAML: the main environment's, where the reports run

    with open(policy_path) as f:
        return yaml.safe_load(f)


def decisions(policy):
    """The policy's windows and keep rules per global layer: `L2 [512:snap, full]` (a bare level is a window)."""
    layers = []
    for layer in policy["per_layer_policies"]:
        rules = layer.get("kv_head_rules", ["window"] * len(layer["kv_head_windows"]))
        heads = [str(w) + ("" if rule == "window" else f":{rule}") for w, rule in zip(layer["kv_head_windows"], rules)]
        layers.append(f"L{layer['layer_id']} [{', '.join(heads)}]")
    return "; ".join(layers)


def keep_rules_asked(policy):
    """The calibration's keep-rule options, as the policy records them: `--keep-rules ...`, `--follow-ups N`."""
    calibration = policy.get("calibration", {})
    asked = f"`--keep-rules {calibration.get('keep_rules', 'window')}`"
    follow_ups = calibration.get("follow_ups")
    return asked + (f", `--follow-ups {follow_ups}`" if follow_ups else "")


def keep_rules_note(r, policy_path):
    """The headwise policy's decisions and their bookkeeping, when some heads select tokens."""
    hw = next(m for m in r["methods"] if m["name"] == "headwise")
    rules = hw.get("details", {}).get("kv_head_rules")
    if not rules:
        return ""
    policy = read_policy(policy_path)
    bookkeeping = policy.get("memory", {}).get("selection_state_bytes", 0)
    used = {rule for heads in rules.values() for rule in heads}
    what = []
    if "h2o" in used:
        what.append("an h2o head fills its slots with heavy hitters (H2O's rule, online)")
    if "snap" in used:
        what.append("a snap head stages the prompt's K/V and at the prompt's end keeps the keys its last 32 "
                    "queries (the question among them) attend to most, SnapKV's selection on its own slots, then "
                    "decodes into a recency ring (docs/keep-rules.md)")
    said = "; ".join(what)
    return (f"Decisions ({keep_rules_asked(policy)}; a bare level is a window): {decisions(policy)}. "
            + said[:1].upper() + said[1:] +
            f". The policy's cache bytes include its selection bookkeeping, {bookkeeping:,} bytes (positions and "
            f"scores of the layers with a selecting head), paid from the same budget.\n\n")


# tools/make_results.sh's settings that change what it makes, shown with the command when given.
SETTINGS = ("MODEL", "CONTEXT", "SHARES", "SAMPLES", "WINDOWS", "TASKS", "EVAL_SEED", "RESULTS", "CALIB_SAMPLES",
            "KEEP_RULES", "FOLLOW_UPS", "TAG", "STATE_DTYPE", "BASELINES", "DUO_STEPS")


def generator():
    """The command that made the report: tools/make_results.sh with the settings it was given."""
    given = [f"{k}={os.environ[k]}" for k in SETTINGS if os.environ.get(k)]
    return " ".join(given + ["tools/make_results.sh"])


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    args = sys.argv[1:]
    out = "docs/results"  # written as OUT.md and OUT.svg
    if args[:1] == ["--out"]:
        out, args = args[1], args[2:]
    if len(args) < 5 or (len(args) - 1) % 4 != 0:
        sys.exit("usage: results_report.py [--out PREFIX] MODEL (SHARE POLICY CALIBRATE_CMD EVAL_CMD)...")
    model, rest = args[0], args[1:]
    runs = [rest[i:i + 4] for i in range(0, len(rest), 4)]
    results = [(share, json.load(open(f"out/results-{share}.json"))) for share, _, _, _ in runs]
    sections = []
    for (share, policy, calibrate, evaluate), (_, r) in zip(runs, results):
        full = next(m for m in r["methods"] if m["name"] == "full")
        sections.append(f"""## Budget {share}% of full KV's global-KV bytes

Policy `{policy}`: context {r["context"]}, KV {r["kv_dtype"]}, batch {r["batch"]}; global KV
{r["policy_global_kv_bytes"]:,} bytes of {full["global_kv_bytes"]:,} for full KV. Evaluated on {r["samples_per_task"]}
samples per task of {r["seq_len"]} tokens (the policy's context), seed {r["seed"]}.

{keep_rules_note(r, policy)}{table(r)}

{eviction_bookkeeping(r)}
{within_budget_summary(r)}

Headwise against each baseline (accuracy; "better"/"worse" only where the 95% intervals do not overlap;
then the paired test on the same samples, which each sample's difficulty does not blur):

{verdict(r)}

```
{calibrate}
{evaluate}
```
""")
    text = f"""# Results: {os.path.basename(model)}

Generated by `{generator()}`; do not edit by hand. The plot: `{out}.svg`.

Every method gets the bytes the policy holds for its global layers (K/V plus the policy's own
selection bookkeeping) and divides them by its own rule; a method that selects tokens online
pays its bookkeeping (a position and a score per slot, a region per head) from those bytes, as
the policy pays its own. Static methods keep a window per head (no bookkeeping) and spend the
bytes to within one block per head; `unconditioned`, like the policy, uses ladder levels only.
A method with no configuration within those bytes (an eviction method whose one block per head
plus bookkeeping, or DuoAttention whose streaming heads alone, exceed them) is not run, and is
listed as such under its budget.

Methods as published: `uniform` one window for every head; `streamingllm` (StreamingLLM) 4
attention-sink tokens plus one recent window for every head; `retrieval-score` ranks heads by
their attention mass on the needle (the HeadKV / RazorAttention family); `duo` (DuoAttention) a
gate per KV head mixing full and streaming attention (128 sinks + 256 recent tokens, as in its
paper; halved together only at a context where they would keep more than half of it), trained with Adam on the RMS-normalised final hidden states at the answer positions of
the calibration samples with its L1 penalty (lr 0.02 with its warm-up and cool-down, penalty 0.05
on the sum of the gates; its step count is in the eval JSON), heads ranked by gate; these two give
full KV to their top heads while it fits and the streaming window to the rest, lengthened as far as
the leftover bytes allow; `random` random ladder levels. Online eviction, each at its own
allocation: `h2o` (H2O) heavy hitters by accumulated attention plus the most recent tokens, half
the slots each, one capacity for every head, evicting during chunked prefill and decode;
`snapkv` (SnapKV) the last 32 prompt queries score every prompt key (attention summed over those
queries and the head's query heads, max-pooled over positions with kernel 7) and each head keeps
its top keys plus that observation window, one capacity for every head; `adakv` (AdaKV) the same
scores, each layer's slots re-divided among its KV heads by the top scores across the layer (each
head at least 20% of the mean per-head budget); `pyramidkv` (PyramidKV) SnapKV's selection with
its pyramidal per-layer budgets (global layer j of G keeps the window plus max - j (max - min) /
(G - 1) tokens per head, min = P/20, max = 2P - min). These three stage the whole prompt's K/V
during prefill and compress at its end, so their prefill peak is full KV, and their prompt logits
are full attention: their KL and perplexity equal full KV's by construction and only accuracy
shows the eviction; each generated token then displaces the lowest-scored kept key.
`snapkv-chunked`, `adakv-chunked` and `pyramidkv-chunked` are the same rules run as they must when
the prompt's K/V may not exceed the budget (chunked prefill in a serving engine): each compresses
after every prefill chunk (256 tokens) over the kept keys plus the chunk's, the chunk's last 32
queries observing; nothing is staged, so the question at the prompt's end chooses only among what
earlier chunks kept.

Ablations, marked so: `unconditioned`, the policy's own calibration (same data, measure, ladder
and budget) rerun with `--no-conditioning`; `pyramid-windows`, PyramidKV's shape of allocation as
recency windows without its selection; `*-headwise-slots`, the eviction rules on the policy's own
slots per head (its K/V bytes to the byte), which measures a keep rule on headwise's allocation,
not the published method, and whose bookkeeping comes on top of the policy's bytes.

"Prefill peak": the cache bytes plus the most prompt K/V a method held beyond them at once,
measured; "(over)": more than the policy's cache bytes, so the method does not fit the budget the
policy was made for (a chunk's own keys are activations for every method and not counted).
Tasks (token-level, in the
format of the built-in retrieval set, `MARKER key SEP value` needles in a haystack of recurring
phrases): `needle_single`, one needle, queried at the end; `needle_multikey`, four needles, all
queried at the end, the last one scored; `needle_chain`, variable tracking (RULER's multi-hop
task): four needles forming one chain, each key the start of the previous needle's value, planted
in shuffled order; the model answers the first query's value, then each next query is fed with
the key copied from the model's own previous answer, so all four hops must be recalled in turn.
Accuracy: the greedy
continuation equals the answer tokens exactly (for `needle_chain`, every hop's value), with its
95% Wilson interval; "mean" pools the tasks. KL: mean KL(full || method) per position over the last prompt positions, ± the half-width
of its 95% interval over samples. Cache bytes: estimated by the memory model and measured from
the runtime decoder's storage after the run ("yes": equal to the byte).

{chr(10).join(sections)}"""
    write_atomically(f"{out}.md", text)
    write_atomically(f"{out}.svg", svg(results))


if __name__ == "__main__":
    main()
