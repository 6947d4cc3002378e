#!/usr/bin/env python3
"""snap heads served three ways give the same tokens (issue 58 item 4): headwise's runtime decoder
(`headwise-calc eval`), HeadwiseCache (python/headwise_hf, transformers as pinned) and HeadwisePress
(python/headwise_kvpress, in .venv-kvpress: transformers 5.2, kvpress 0.5.5).

The policy comes from the committed policies/tiny-gemma3-8k-peers-4k-25.yaml (copied to a temp dir,
never edited in place): every global head 128 slots, kv_head_rules mixing window and snap heads in
layers 2, 8 and 11 (h2o left out: a press cannot serve it). On the samples `eval --write-samples`
writes for it (needles 1024 tokens back, outside every window), greedy answers:
- the runtime decoder answers every sample right, and HeadwiseCache gives its tokens on every sample,
  token by token (`eval --write-tokens`: each sample's decoded tokens, named by its prompt's SHA-256);
- HeadwisePress produces HeadwiseCache's tokens on every sample, and every snap head holds the
  positions HeadwiseCache's holds after the answer (the choice at the prompt's end and the ring);
- the same policy with layer 8's snap head turned `window` loses a needle in the runtime decoder, and
  all three give the same (wrong) tokens there too;
- the press refuses h2o heads and another model's policy in one line;
- tools/paired_answers.py pairs the two policies' runtime answers (snap minus swapped: the share of
  samples only the snap policy answers) and refuses a row whose prompt is not its sample's.
Exit 0 on success, 1 on failure, 4 when kvpress cannot be imported from --venv, unless
HEADWISE_REQUIRE_KVPRESS=1.

    test_snap_serving.py --cli build/bin/headwise-calc [--venv .venv-kvpress]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

MODEL = ROOT / "models" / "tiny-gemma3-8k"
SOURCE_POLICY = ROOT / "policies" / "tiny-gemma3-8k-peers-4k-25.yaml"
SNAP = {2: ["snap", "window"], 5: ["snap", "snap"], 8: ["snap", "window"], 11: ["window", "snap"]}
SWAPPED = {**SNAP, 8: ["window", "window"]}  # layer 8's retrieving head keeps a window instead
SAMPLES = ["--tasks", "needle_single,needle_multikey", "--samples", "4", "--seq-len", "1024",
           "--allow-short-seq-len", "--seed", "5"]


def write_policy(path, rules, window=128):
    """A copy of the committed policy with every global head at `window` and the given rules; its
    memory block (for the committed rules) is dropped, so readers check layers and windows only."""
    import yaml

    doc = yaml.safe_load(SOURCE_POLICY.read_text())
    for key in ("memory", "non_global_layers"):
        doc.pop(key, None)
    doc["model_path"] = str(MODEL)
    for entry in doc["per_layer_policies"]:
        entry["kv_head_windows"] = [window] * len(entry["kv_head_windows"])
        entry["kv_head_rules"] = rules[entry["layer_id"]]
        entry.pop("expected_distortion", None)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def load_model():
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32, attn_implementation="sdpa").eval()


def snap_positions(held):
    """{"layer/head": sorted positions} of the snap heads."""
    return {k: sorted(v) for k, v in held.items()}


# --- the press, in kvpress's environment ------------------------------------------------------
def press_answers(model, policy, samples, decode="ring"):
    import torch
    from transformers import DynamicCache

    import peers_eval as pe
    from headwise_kvpress import HeadwisePress

    rows = []
    with torch.no_grad():
        for sample in samples:
            press = HeadwisePress(policy, decode=decode)
            with press(model):
                right, produced = pe.answer(model, DynamicCache(config=model.config), sample,
                                            lambda c, p: pe.next_token(model, c, p, 0))
            held = {}
            for layer, state in press._state.items():
                for h, rule in enumerate(press.policy.rules[layer]):
                    if rule == "snap":
                        pos = state.position[0, h]
                        held[f"{layer}/{h}"] = pos[pos >= 0].tolist()
            rows.append({"right": right, "generated": produced, "held": held})
    return rows


def press_refusals(snap_policy):
    """One-line refusals: an h2o head (the committed policy has some), another model's policy."""
    from transformers import AutoModelForCausalLM

    from headwise_hf.policy import PolicyError
    from headwise_kvpress import HeadwisePress

    out = {}
    try:
        HeadwisePress(str(SOURCE_POLICY))
        out["h2o"] = ""
    except PolicyError as e:
        out["h2o"] = str(e)
    other = AutoModelForCausalLM.from_pretrained(str(ROOT / "tests" / "fixtures" / "gemma3_gqa4"))
    try:
        with HeadwisePress(str(snap_policy))(other):
            pass
        out["other"] = ""
    except PolicyError as e:
        out["other"] = str(e)
    return out


def press_worker(jobs_path):
    """Runs in .venv-kvpress: every job {policy, samples, out} and the refusals, one model load."""
    jobs = json.loads(pathlib.Path(jobs_path).read_text())
    model = load_model()
    for job in jobs["answers"]:
        samples = [json.loads(line) for line in pathlib.Path(job["samples"]).read_text().splitlines()]
        pathlib.Path(job["out"]).write_text(json.dumps(press_answers(model, job["policy"], samples)))
    pathlib.Path(jobs["refusals"]["out"]).write_text(json.dumps(press_refusals(jobs["refusals"]["policy"])))


def run_press(venv, tmp, policies, samples_path):
    """The press's answers for each policy on the samples, and its refusals (one venv process)."""
    jobs = {"answers": [{"policy": str(p), "samples": str(samples_path), "out": str(tmp / f"press-{i}.json")}
                        for i, p in enumerate(policies)],
            "refusals": {"policy": str(policies[0]), "out": str(tmp / "refusals.json")}}
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    r = subprocess.run([str(venv / "bin" / "python"), __file__, "--press-worker", str(tmp / "jobs.json")],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"FAIL the press in {venv}: {r.stderr.strip()[-2000:]}")
    answers = [json.loads(pathlib.Path(j["out"]).read_text()) for j in jobs["answers"]]
    return answers, json.loads((tmp / "refusals.json").read_text())


# --- HeadwiseCache and the runtime, in the main environment --------------------------------------
def cache_answers(model, policy, samples):
    import torch

    import peers_eval as pe
    from headwise_hf import HeadwiseCache

    rows = []
    with torch.no_grad():
        for sample in samples:
            cache = HeadwiseCache.from_policy(str(policy), model)
            right, produced = pe.answer(model, cache, sample, lambda c, p: pe.next_token(model, c, p, 0))
            held = {}
            for layer in cache.headwise_layers():
                for h, head in enumerate(getattr(layer, "heads", [])):
                    if head.snap:
                        held[f"{layer.layer_id}/{h}"] = head.position[0, :head.held[0]].tolist()
            rows.append({"right": right, "generated": produced, "held": held})
    return rows


def runtime_tokens(path, policy, samples):
    """The runtime decoder's answers (`eval --write-tokens`) for `policy`, in sample order, each checked to
    answer the --write-samples sample of its line: the same prompt (its SHA-256) and task."""
    import hashlib

    rows = [r for r in map(json.loads, path.read_text().splitlines())
            if r["policy"] == str(policy) and r["method"] == "headwise"]
    if [r["sample"] for r in rows] != list(range(len(samples))):
        raise SystemExit(f"FAIL {path}: policy {policy}: samples {[r['sample'] for r in rows]}, want "
                         f"0..{len(samples) - 1}")
    for r, s in zip(rows, samples):
        sha = hashlib.sha256(",".join(map(str, s["prompt"])).encode()).hexdigest()
        if (r["task"], r["prompt_tokens"], r["prompt_sha256"]) != (s["task"], len(s["prompt"]), sha):
            raise SystemExit(f"FAIL {path}: sample {r['sample']} is not the prompt of --write-samples' line")
    return rows


def check_paired_answers(check, tmp, samples_path, tokens_path, runtime, runtime_w):
    """tools/paired_answers.py on these files: the snap policy against its swapped copy is the share of samples
    only the snap policy answers, and a tokens file whose prompt is not its sample's is refused in one line."""
    tool = [sys.executable, str(ROOT / "tools" / "paired_answers.py"), "--samples", str(samples_path)]
    r = subprocess.run(tool + ["--tokens", str(tokens_path), "--against", "snap:headwise"], capture_output=True,
                       text=True)
    row = next((line for line in r.stdout.splitlines() if line.startswith("| swapped:headwise |")), "")
    n = len(runtime)
    diff = (sum(a["right"] and not b["right"] for a, b in zip(runtime, runtime_w))
            - sum(b["right"] and not a["right"] for a, b in zip(runtime, runtime_w))) / n
    check(r.returncode == 0 and f"| {diff:+.3f} [" in row,
          f"tools/paired_answers.py pairs the two policies: snap - swapped {diff:+.3f} ({row or r.stderr.strip()})")
    rows = tokens_path.read_text().splitlines()
    first = json.loads(rows[0])
    first["prompt_sha256"] = "0" * 64
    bad = tmp / "tokens-bad.jsonl"
    bad.write_text("\n".join([json.dumps(first)] + rows[1:]) + "\n")
    r = subprocess.run(tool + ["--tokens", str(bad), "--against", "snap:headwise"], capture_output=True, text=True)
    err = r.stderr.strip()
    check(r.returncode == 2 and not r.stdout and "\n" not in err and "did not answer that sample's prompt" in err,
          f"tools/paired_answers.py refuses a row whose prompt is not its sample's, in one line: {err}")
    check_export(check, tool, tmp, tokens_path, runtime)


def check_export(check, tool, tmp, tokens_path, runtime):
    """--export writes the snap policy's runtime answers as the peers harness writes its own (docs/results-peers.md
    reports a runtime-only ablation so), with the eval JSON's global bytes, and refuses a policy eval did not run."""
    policy = str(tmp / "snap.yaml")
    out = tmp / "answers-export.jsonl"
    export = tool + ["--tokens", str(tokens_path), "--export", "headwise", "--policy", policy,
                     "--eval-json", str(tmp / "eval.json"), "--out", str(out)]
    r = subprocess.run(export, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    evaluation = next(e for e in json.loads((tmp / "eval.json").read_text())["evaluations"] if e["policy"] == policy)
    m = next(m for m in evaluation["methods"] if m["name"] == "headwise")
    kept = m["global_kv_bytes"] + m["details"]["auxiliary_bytes_measured"]
    peak = kept + m["details"]["prefill_staged_peak_bytes_measured"]
    by_key = {(x["task"], x["index"]): x for x in rows}
    same = sum(by_key.get((x["task"], x["index"]), {}).get("generated") == x["generated"]
               and by_key[(x["task"], x["index"])]["right"] == x["right"] for x in runtime)
    check(r.returncode == 0 and len(rows) == len(runtime) and same == len(runtime)
          and all((x["kept_bytes"], x["held_bytes"], x["prefill_peak_bytes"]) == (kept, kept, peak) for x in rows)
          and peak > kept,
          f"tools/paired_answers.py --export writes the runtime's answers for the peers report: {same}/{len(runtime)} "
          f"rows, kept {kept:,} B, prefill peak {peak:,} B ({r.stderr.strip()})")
    r = subprocess.run(export[:-6] + ["--policy", str(tmp / "other.yaml")] + export[-4:], capture_output=True,
                       text=True)
    err = r.stderr.strip()
    check(r.returncode == 2 and "\n" not in err and "answered 0 samples" in err,
          f"--export refuses a policy the eval did not run, in one line: {err}")


def run(cli, *args):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"FAIL {' '.join(map(str, args))}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--press-worker":
        press_worker(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--venv", default=str(ROOT / ".venv-kvpress"))
    args = ap.parse_args()
    venv = pathlib.Path(args.venv)
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import kvpress"], capture_output=True, text=True) \
        if (venv / "bin" / "python").exists() else None
    if probe is None or probe.returncode != 0:
        why = "no venv" if probe is None else probe.stderr.strip().splitlines()[-1]
        if os.environ.get("HEADWISE_REQUIRE_KVPRESS") == "1":
            print(f"FAIL: kvpress cannot be imported from {venv} ({why}); tools/setup.sh --kvpress installs it")
            return 1
        print(f"SKIP: kvpress cannot be imported from {venv} ({why})")
        return 4
    import importlib.util

    missing = [m for m in ("torch", "transformers", "yaml") if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get("HEADWISE_PYTHON_STACK_OPTIONAL") == "1":
            print(f"SKIP (HEADWISE_PYTHON_STACK_OPTIONAL=1): no {', '.join(missing)}")
            return 4
        print(f"FAIL: the Python stack is missing ({', '.join(missing)}); tools/setup.sh installs it")
        return 1
    import cpu_paths  # the kernels headwise-calc runs (test_hf_cache.py does the same)

    cpu_paths.pin()
    from checklist import Checklist

    check = Checklist()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="headwise-snap-") as d:
        tmp = pathlib.Path(d)
        policy = write_policy(tmp / "snap.yaml", SNAP)
        swapped = write_policy(tmp / "swapped.yaml", SWAPPED)
        samples_path = tmp / "samples.jsonl"
        run(args.cli, "eval", "--model", MODEL, "--policy", policy, *SAMPLES, "--write-samples", samples_path, "-q")
        samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
        # Both policies in one eval (one model load; they share the samples): the tokens it decoded.
        tokens_path = tmp / "tokens.jsonl"
        (tmp / "eval.json").write_text(run(args.cli, "eval", "--model", MODEL, "--policy", policy, "--policy", swapped,
                                           *SAMPLES, "--baselines", "", "--write-tokens", tokens_path, "--json", "-q"))
        runtime, runtime_w = (runtime_tokens(tokens_path, p, samples) for p in (policy, swapped))
        check(all(r["right"] for r in runtime),
              f"the runtime decoder answers every one of the {len(samples)} samples "
              f"({sum(r['right'] for r in runtime)}/{len(runtime)})")

        check_paired_answers(check, tmp, samples_path, tokens_path, runtime, runtime_w)

        # The press first (another process, its own model): it runs while nothing else here does.
        (press, press_w), refusals = run_press(venv, tmp, [policy, swapped], samples_path)
        model = load_model()
        cache = cache_answers(model, policy, samples)
        same = sum(c["generated"] == r["generated"] for c, r in zip(cache, runtime))
        check(same == len(samples), f"HeadwiseCache gives the runtime decoder's tokens on {same}/{len(samples)} "
              f"samples, token by token ({sum(r['right'] for r in cache)} answered right)")
        same = sum(p["generated"] == c["generated"] for p, c in zip(press, cache))
        check(same == len(samples), f"HeadwisePress gives HeadwiseCache's tokens on {same}/{len(samples)} samples")
        held = sum(snap_positions(p["held"]) == snap_positions(c["held"]) for p, c in zip(press, cache))
        check(held == len(samples) and all(c["held"] for c in cache),
              f"after the answer every snap head holds HeadwiseCache's positions in the press ({held}/{len(samples)} "
              f"samples, {len(cache[0]['held'])} snap heads)")

        # The rule matters: layer 8's head as a window loses a needle, in all three, with the same wrong tokens
        # (so the equality above is not that of three servings failing alike).
        cache_w = cache_answers(model, swapped, samples)
        lost = sum(not r["right"] for r in runtime_w)
        agree = sum(r["generated"] == c["generated"] == p["generated"] for r, c, p in zip(runtime_w, cache_w, press_w))
        check(0 < lost and agree == len(samples),
              f"layer 8 head 0 as `window`: the runtime decoder loses the needle on {lost}/{len(samples)} samples, and "
              f"it, HeadwiseCache and HeadwisePress give the same tokens on {agree}/{len(samples)}")
        h2o, other = refusals.get("h2o", ""), refusals.get("other", "")
        check("h2o" in h2o and "layer 2 head 0" in h2o and "\n" not in h2o, f"the press refuses h2o heads: {h2o}")
        check("layers" in other and "\n" not in other, f"the press refuses another model's policy: {other}")
    print(f"     {time.time() - t0:.1f} s")
    return check.exit_status()


if __name__ == "__main__":
    sys.exit(main())
