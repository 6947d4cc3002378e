#!/usr/bin/env python3
"""Trains the shipped default model, models/tiny-qwen3-next, on this machine's CPU.

A small Qwen3-Next-layout hybrid (gated-DeltaNet layers + gated full-attention layers with GQA),
built with transformers (pinned in versions.env) from a fixed seed and trained on a generated mix of

  (a) needles in the format of headwise's built-in retrieval set (`MARKER k1 k2 SEP v1 v2 v3`,
      queried at the end), in a haystack of recurring random phrases or of a synthetic
      "language" (a sparse Markov chain over 240 word tokens with phrases and echoes),
  (b) copy samples (random spans repeated later), after a warm-up on pure repeated spans, and
  (c) the older record task (`key k1 k2 = v1 v2 v3 ;` queried later) with two-hop variable
      tracking (`var b1 b2 = a1 a2 ;` aliases, queried with `print b1 b2 =`).

Nothing is planted in the weights: retrieval and local heads have to emerge from training.
Data is a pure function of (seed, step), so a killed run resumes exactly from its last checkpoint
(`--run DIR`, default out/train-default-model/). Curriculum: context 128 -> 256 -> 512 -> 1024 ->
2048 (STAGES).

    python3 tools/train_default_model.py                 # train (or resume) and export
    python3 tools/train_default_model.py --export-only   # re-export the last checkpoint
    python3 tools/eval_default_model.py --context 2048   # needle accuracy of the shipped model

Continuation (longer contexts): `--init-from DIR` loads a trained model (e.g. the shipped bf16
weights, as fp32) and trains CONT_STEPS more steps on CONT_STAGES (4K then 8K, batch 1, same data
mix and answer weighting) with a fine-tuning schedule (peak lr 5e-4, 20 warm-up steps, cosine).
Steps are numbered on from the end of the initial run (1800), so its data stream, still a pure
function of (seed, step), never repeats the initial training's; it checkpoints and resumes in its
own run dir (default out/train-8k/) and exports to out/tiny-qwen3-next-8k/ by default.

    python3 tools/train_default_model.py --init-from models/tiny-qwen3-next   # train (or resume) 8K

Token ids are the vocabulary (tokenizer.json maps each id to one character, see TOKENS below).
"""
import argparse
import json
import math
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

# ---------------------------------------------------------------------------------------------
# Vocabulary: 512 ids, each written as one character so that a merge-free BPE tokenizer.json
# encodes text to exactly these ids.
PAD, BOS, EOS, KEY, EQ, END, VAR, PRINT, LP, RP = range(10)
SPECIAL_TEXT = ["<pad>", "<s>", "</s>", "§", "=", ";", "$", "?", "(", ")"]
N_KEYS, N_VALUES, N_WORDS = 128, 128, 240
KEY0 = 16                      # keys: 16..143, written as Cyrillic letters
VAL0 = KEY0 + N_KEYS           # values: 144..271, written as Latin Extended letters
WORD0 = VAL0 + N_VALUES        # words: 272..511, written as CJK ideographs
VOCAB = WORD0 + N_WORDS
assert VOCAB == 512


def token_text(i):
    if i < len(SPECIAL_TEXT):
        return SPECIAL_TEXT[i]
    if i < KEY0:
        return f"<unused{i}>"
    if i < VAL0:
        return chr(0x0400 + (i - KEY0))
    if i < WORD0:
        return chr(0x0100 + (i - VAL0))
    return chr(0x4E00 + (i - WORD0))


TOKENS = [token_text(i) for i in range(VOCAB)]
assert len(set(TOKENS)) == VOCAB

CONFIG = {
    "vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention"] * 2,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
    "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "num_experts": 0, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 65536, "tie_word_embeddings": False, "bos_token_id": BOS, "eos_token_id": EOS,
    "pad_token_id": PAD,
}

# Curriculum: (first step, context, batch, most needles per retrieval sample, share of the
# older record/variable-tracking samples, share of copy samples). Short contexts first: in-context
# copying (the induction circuit retrieval needs) forms fastest on many short samples, and copy
# samples (random spans repeated later) grow it within a few hundred steps; the contexts then
# grow to 2K so the heads learn to reach across the whole window.
STAGES = [(0, 128, 16, 0, 0.0, 1.0), (300, 128, 16, 2, 0.1, 0.5), (600, 256, 8, 4, 0.1, 0.25),
          (900, 512, 4, 8, 0.1, 0.1), (1200, 1024, 2, 8, 0.1, 0.05), (1500, 2048, 1, 8, 0.1, 0.05)]
STEPS = 1800
ANSWER_WEIGHT = 5.0

# Continuation from the trained model (--init-from): 100 steps at 4K, then 280 at 8K, batch 1,
# needles 1..8 spread over the whole context; steps continue from STEPS.
CONT_STAGES = [(1800, 4096, 1, 8, 0.1, 0.05), (1900, 8192, 1, 8, 0.1, 0.05)]
CONT_STEPS = 2180
CONT_LR, CONT_WARMUP = 5e-4, 20


# ---------------------------------------------------------------------------------------------
# Data: a fixed synthetic language (from LANG_SEED) and per-sample generators (from any seed).
LANG_SEED = 1234


class Language:
    def __init__(self, seed=LANG_SEED):
        rng = np.random.default_rng(seed)
        self.succ = rng.integers(0, N_WORDS, size=(N_WORDS, 4)) + WORD0
        self.succ_p = np.array([0.5, 0.25, 0.15, 0.10])
        self.phrases = [list(rng.integers(0, N_WORDS, size=rng.integers(3, 8)) + WORD0) for _ in range(48)]

    def filler(self, rng, n):
        """n tokens of local-structure text."""
        out = []
        w = int(rng.integers(0, N_WORDS)) + WORD0
        while len(out) < n:
            r = rng.random()
            if r < 0.10:
                out += self.phrases[int(rng.integers(0, len(self.phrases)))]
            elif r < 0.14 and len(out) >= 8:
                k = int(rng.integers(3, 7))  # echo: "( the last k tokens )"
                out += [LP] + out[-k - 1:-1] + [RP] if out[-1] not in (LP, RP) else []
            else:
                for _ in range(int(rng.integers(4, 12))):
                    w = int(self.succ[w - WORD0][rng.choice(4, p=self.succ_p)])
                    out.append(w)
        return out[:n]


LANG = Language()


def fresh_keys(rng, n, key_len):
    """n distinct keys of key_len tokens (n is capped at the number of keys)."""
    flat = rng.choice(N_KEYS ** key_len, size=min(n, N_KEYS ** key_len), replace=False)
    if key_len == 1:
        return [(KEY0 + int(f),) for f in flat]
    return [(KEY0 + int(f) // N_KEYS, KEY0 + int(f) % N_KEYS) for f in flat]


def values(rng):
    return [VAL0 + int(v) for v in rng.integers(0, N_VALUES, size=3)]


class Builder:
    """Token list plus per-token loss weights; answers are the tokens after `=` of a query."""

    def __init__(self):
        self.tokens, self.weights = [BOS], [1.0]

    def add(self, toks, w=1.0):
        self.tokens += toks
        self.weights += [w] * len(toks)

    def record(self, head, key, val):
        self.add([head, *key, EQ, *val, END])

    def query(self, head, key, val):
        self.add([head, *key, EQ])
        self.add(val, ANSWER_WEIGHT)
        self.add([END])


def sample_mqar(rng, T, gap=48, key_len=1):
    """Dense multi-key recall and variable tracking: records and queries interleaved with text."""
    b = Builder()
    keys = fresh_keys(rng, T // 8, key_len)
    ki = 0
    recs, vars_ = [], []
    while len(b.tokens) < T:
        b.add(LANG.filler(rng, int(rng.integers(4 if gap >= 12 else 1, gap))))
        r = rng.random()
        if r < 0.35 or not recs:
            key, val = keys[ki], values(rng)
            ki += 1
            recs.append((key, val))
            b.record(KEY, key, val)
        elif r < 0.80:
            key, val = recs[int(rng.integers(0, len(recs)))]
            b.query(KEY, key, val)
        elif r < 0.90:  # variable: define a value, then alias it later
            key, val = keys[ki], values(rng)
            ki += 1
            b.record(VAR, key, val)
            vars_.append((key, val))
        elif vars_:
            src, val = vars_[int(rng.integers(0, len(vars_)))]
            alias = keys[ki]
            ki += 1
            b.add(LANG.filler(rng, int(rng.integers(4 if gap >= 12 else 1, gap))))
            b.add([VAR, *alias, EQ, *src, END])
            b.add(LANG.filler(rng, int(rng.integers(4 if gap >= 12 else 1, gap))))
            b.query(PRINT, alias, val)
    return b.tokens[:T], b.weights[:T]


# The format of headwise's built-in retrieval set (src/tasks/synthetic.cpp) for a 512-token
# vocabulary, which `headwise-calc eval` plants as its needle tasks: a needle is
# MARKER k1 k2 SEP v1 v2 v3; the haystack is short phrases of content tokens repeated in random
# order (or the synthetic language); every needle is queried at the end in shuffled order.
MARKER, SEP, CONTENT0 = 64, 65, 66


def haystack_text(rng, T, haystack_len):
    """Haystack tokens for a T-token retrieval sample: recurring random phrases (70%) or the
    synthetic language."""
    if rng.random() < 0.7:
        # headwise's set draws 24 phrases; short contexts get fewer so phrases recur in them too
        # (predicting a recurring phrase is in-context copying, the circuit the needles need).
        content = lambda k: [int(t) for t in rng.integers(CONTENT0, VOCAB, size=k)]
        phrases = [content(int(rng.integers(3, 9))) for _ in range(max(4, min(24, T // 48)))]
        text = []
        while len(text) < haystack_len:
            text += phrases[int(rng.integers(0, len(phrases)))]
        return text
    return LANG.filler(rng, haystack_len)


def plant_needles(b, text, haystack_len, depths, needles):
    """Adds `text` to the builder with needle i (key, value) as MARKER key SEP value at depths[i],
    up to 1 + haystack_len tokens in all."""
    used = 0  # haystack text consumed
    for d, (key, val) in zip(depths, needles):
        gap = max(0, d - (len(b.tokens) - 1))
        b.add(text[used:used + gap])
        used += gap
        b.add([MARKER, *key, SEP, *val])
    b.add(text[used:used + (1 + haystack_len - len(b.tokens))])


def sample_needles(rng, T, n_needles):
    """Returns tokens, loss weights and (prompt_len, answer) per query."""
    needle_len = 1 + 2 + 1 + 3
    n = n_needles
    content = lambda k: [int(t) for t in rng.integers(CONTENT0, VOCAB, size=k)]
    keys = [content(2) for _ in range(n)]
    vals = [content(3) for _ in range(n)]
    haystack_len = T - 1 - n * needle_len
    depths = [int((i + rng.random()) / n * max(1, haystack_len - needle_len)) for i in range(n)]
    b = Builder()
    plant_needles(b, haystack_text(rng, T, haystack_len), haystack_len, depths, list(zip(keys, vals)))
    queries = []
    for i in rng.permutation(n):
        b.add([MARKER, *keys[i], SEP])
        queries.append((len(b.tokens), vals[i]))
        b.add(vals[i], ANSWER_WEIGHT)
    assert len(b.tokens) == T, (len(b.tokens), T)
    return b.tokens, b.weights, queries


def sample_chain(rng, T, hops=4):
    """Variable tracking in the format of headwise's chained needles (src/tasks/synthetic.cpp,
    `needle_chain` in `headwise-calc eval`): needle n's key is the first two tokens of needle
    n-1's value, the needles are planted in shuffled order (the text's order says nothing of the
    chain's) and queried at the end in chain order. Returns tokens, loss weights and the positions
    of the tokens the model must produce (every hop's value). Not in `batch`: the Gemma-3 model's
    chain phase and the probes draw it, so the default model's data stream is unchanged."""
    needle_len = 1 + 2 + 1 + 3
    content = lambda k: [int(t) for t in rng.integers(CONTENT0, VOCAB, size=k)]
    keys, vals = [content(2)], []
    for h in range(hops):
        vals.append(content(3))
        if h + 1 < hops:
            keys.append(vals[-1][:2])
    haystack_len = T - 1 - hops * needle_len
    depths = [int((i + rng.random()) / hops * max(1, haystack_len - needle_len)) for i in range(hops)]
    planted = rng.permutation(hops)
    b = Builder()
    plant_needles(b, haystack_text(rng, T, haystack_len), haystack_len, depths,
                  [(keys[i], vals[i]) for i in planted])
    positions = []
    for key, val in zip(keys, vals):
        b.add([MARKER, *key, SEP])
        positions += range(len(b.tokens), len(b.tokens) + len(val))
        b.add(val, ANSWER_WEIGHT)
    assert len(b.tokens) == T, (len(b.tokens), T)
    return b.tokens, b.weights, positions


def sample_repeats(rng, T):
    """A random span repeated until the sample is full: everything after the first copy is
    predictable only by looking back, so this grows the copying circuit fastest (a warm-up)."""
    span = [int(t) for t in rng.integers(CONTENT0, VOCAB, size=int(rng.integers(8, 33)))]
    b = Builder()
    b.add(span)
    while len(b.tokens) < T:
        b.add(span, ANSWER_WEIGHT)
    return b.tokens[:T], b.weights[:T]


def sample_copy(rng, T):
    """Random spans of key/value ids, each repeated after some text; the repeat is the target."""
    b = Builder()
    while len(b.tokens) < T:
        span = [int(t) for t in rng.integers(CONTENT0, VOCAB, size=int(rng.integers(8, 25)))]
        b.add(LANG.filler(rng, int(rng.integers(2, 16))))
        b.add(span)
        b.add(LANG.filler(rng, int(rng.integers(0, 64))))
        b.add(span[:1])
        b.add(span[1:], ANSWER_WEIGHT)
    return b.tokens[:T], b.weights[:T]


def batch(seed, step, stages=STAGES):
    _, T, B, max_needles, p_old, p_copy = stage(step, stages)
    rng = np.random.default_rng([seed, step])
    toks, ws = [], []
    for _ in range(B):
        r = rng.random()
        if p_copy == 1.0:
            t, w = sample_repeats(rng, T)
        elif r < p_copy:
            t, w = sample_copy(rng, T)
        elif r < p_copy + p_old:
            t, w = sample_mqar(rng, T, 32 if T >= 512 else 12, 2)
        else:
            t, w, _ = sample_needles(rng, T, int(rng.integers(1, max_needles + 1)))
        toks.append(t)
        ws.append(w)
    return np.array(toks, dtype=np.int64), np.array(ws, dtype=np.float32)


def stage(step, stages=STAGES):
    cur = stages[0]
    for s in stages:
        if step >= s[0]:
            cur = s
    return cur


def lr_at(step, peak, steps, warmup=100):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


# ---------------------------------------------------------------------------------------------
def build_model(seed):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model("qwen3_next", **CONFIG)
    # SDPA is the same attention math as eager, faster on the CPU at 2K; the shipped config
    # leaves the implementation to the loader.
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def write_tokenizer(out):
    """Merge-free BPE over the 512 one-character tokens (specials are added tokens)."""
    vocab = {t: i for i, t in enumerate(TOKENS)}
    added = [{"id": i, "content": TOKENS[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in (PAD, BOS, EOS)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": None, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": False, "vocab": vocab, "merges": []}}
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=1) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "pad_token": "<pad>", "add_bos_token": False}, indent=1) + "\n")


def load_init(model, init_dir):
    """Loads a saved model's weights (bf16 safetensors of the shipped model) as fp32."""
    import torch
    from safetensors.torch import load_file

    sd = {k: v.to(torch.float32) for k, v in load_file(str(pathlib.Path(init_dir) / "model.safetensors")).items()}
    model.load_state_dict(sd, strict=True)


def export(model, out, meta):
    import torch

    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        if f.name != "README.md":
            f.unlink()
    model = model.to(torch.bfloat16)
    model.config._attn_implementation = "eager"
    model.save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    write_tokenizer(out)
    (out / "training.json").write_text(json.dumps(meta, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help=f"last step ({STEPS}; {CONT_STEPS} with --init-from)")
    ap.add_argument("--lr", type=float, default=None, help=f"peak lr (1e-3; {CONT_LR} with --init-from)")
    ap.add_argument("--warmup", type=int, default=None, help=f"warm-up steps (100; {CONT_WARMUP} with --init-from)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda; data and schedule are the same")
    ap.add_argument("--init-from", default=None,
                    help="continue from this model dir (e.g. models/tiny-qwen3-next) on CONT_STAGES")
    ap.add_argument("--run", default=None, help="checkpoint dir (out/train-default-model; out/train-8k with --init-from)")
    ap.add_argument("--out", default=None, help="export dir (models/tiny-qwen3-next; out/tiny-qwen3-next-8k with --init-from)")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--probe-samples", type=int, default=16)
    ap.add_argument("--export-only", action="store_true")
    args = ap.parse_args()
    cont = args.init_from is not None
    stages = CONT_STAGES if cont else STAGES
    first = stages[0][0]  # 0, or STEPS for a continuation
    if args.steps is None:
        args.steps = CONT_STEPS if cont else STEPS
    if args.lr is None:
        args.lr = CONT_LR if cont else 1e-3
    if args.warmup is None:
        args.warmup = CONT_WARMUP if cont else 100
    if args.run is None:
        args.run = str(ROOT / "out" / ("train-8k" if cont else "train-default-model"))
    if args.out is None:
        args.out = str(ROOT / ("out/tiny-qwen3-next-8k" if cont else "models/tiny-qwen3-next"))
    lr_of = lambda s: lr_at(s - first, args.lr, args.steps - first, args.warmup)

    from fixtures.common import check_versions
    check_versions()
    import torch
    torch.set_num_threads(args.threads)

    run = pathlib.Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    model = build_model(args.seed).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, wall = first, 0.0
    init_meta = None
    if cont:
        init_meta = json.loads((pathlib.Path(args.init_from) / "training.json").read_text())
        load_init(model, args.init_from)
    ck = run / "checkpoint.pt"
    if ck.exists():
        state = torch.load(ck, weights_only=False, map_location=args.device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, wall = state["step"], state["wall"]
        print(f"resumed at step {step} ({wall / 60:.1f} min)", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    if cont:
        meta = lambda: {"seed": args.seed, "steps": step, "lr": args.lr, "warmup": args.warmup,
                        "schedule": "linear warm-up, cosine to 10% over the continuation steps",
                        "stages": stages, "wall_s": round(wall),
                        "init_from": os.path.relpath(pathlib.Path(args.init_from).resolve(), ROOT),
                        "init": init_meta, "total_wall_s": round(wall) + init_meta.get("wall_s", 0),
                        "params": n_params, "answer_weight": ANSWER_WEIGHT, "lang_seed": LANG_SEED}
    else:
        meta = lambda: {"seed": args.seed, "steps": step, "lr": args.lr, "stages": STAGES, "wall_s": round(wall),
                        "params": n_params, "answer_weight": ANSWER_WEIGHT, "lang_seed": LANG_SEED}
    if args.export_only:
        export(model.cpu(), pathlib.Path(args.out), meta())
        return

    log = open(run / "log.jsonl", "a")
    model.train()
    acc_n = acc_hit = 0
    loss_sum = loss_n = 0
    t_last = time.time()
    while step < args.steps:
        T = stage(step, stages)[1]
        x, w = batch(args.seed, step, stages)
        x, w = torch.from_numpy(x).to(args.device), torch.from_numpy(w).to(args.device)
        for g in opt.param_groups:
            g["lr"] = lr_of(step)
        logits = model(input_ids=x).logits[:, :-1].float()
        tgt, wt = x[:, 1:], w[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), reduction="none")
        loss = (nll * wt.reshape(-1)).sum() / wt.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ans = wt > 1
        acc_hit += int((logits.argmax(-1)[ans] == tgt[ans]).sum())
        acc_n += int(ans.sum())
        loss_sum += float(nll.detach().mean())
        loss_n += 1
        step += 1
        now = time.time()
        wall += now - t_last
        t_last = now
        if step % 10 == 0:
            rec = {"step": step, "T": T, "lr": round(lr_of(step), 6),
                   "loss": round(loss_sum / loss_n, 4), "answer_acc": round(acc_hit / max(1, acc_n), 3),
                   "wall_min": round(wall / 60, 2)}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            acc_n = acc_hit = loss_n = 0
            loss_sum = 0.0
        if step % args.eval_every == 0 or step == args.steps:
            from eval_default_model import needle_accuracy
            model.eval()
            ev = {"step": step, "eval": {}}
            if cont:  # both tasks at the current context
                for task in ("passkey", "kv"):
                    ev["eval"][f"{task}@{T}"] = needle_accuracy(model, T, samples=args.probe_samples, seed=777,
                                                                task=task, batch=1)
            else:
                for ctx in sorted({T, 2048} if T >= 1024 else {T}):
                    ev["eval"][ctx] = needle_accuracy(model, ctx, samples=args.probe_samples, seed=777)
            model.train()
            print(json.dumps(ev), flush=True)
            log.write(json.dumps(ev) + "\n")
            log.flush()
            t_last = time.time()  # eval time is not training time
        if step % args.ckpt_every == 0 or step == args.steps:
            tmp = run / "checkpoint.tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "wall": wall}, tmp)
            os.replace(tmp, ck)
    export(model.cpu(), pathlib.Path(args.out), meta())
    print(json.dumps({"exported": args.out, **meta()}), flush=True)


if __name__ == "__main__":
    main()
