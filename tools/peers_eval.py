#!/usr/bin/env python3
"""Answers headwise's eval samples with the field's own implementations (kvpress) and with headwise
in transformers (python/headwise_hf), one method at a time, for docs/results-peers.md.

The samples come from `headwise-calc eval --write-samples FILE` (the exact samples headwise's own
eval answers: task, prompt, answer, answer_source). Each method answers every sample greedily: a
plain answer is the greedy continuation of the prompt; a chain's later queries are fed with the
key copied from the model's own previous answer, as the C++ eval does. A sample is right when every
token the model produced equals the answer's.

Methods (the environment each needs):
  full                 transformers' DynamicCache, the whole prompt in one forward (either venv;
                       `full@kvpress` is the same, named for the run in kvpress's environment)
  headwise             HeadwiseCache.from_policy(--policy), prefilled in --prefill-chunk chunks, as
                       a serving engine prefills (main environment, transformers as pinned)
  unconditioned        the same with --unconditioned-policy (headwise's --no-conditioning ablation)
  headwise-press       the policy (--policy) through HeadwisePress (python/headwise_kvpress, .venv-kvpress): each
                       global layer compressed after the prompt's forward as the policy's rules keep (window
                       and snap heads; h2o refused), decoding with the snap heads' ring masked as the runtime
                       drops it; the tokens are HeadwiseCache's (tests/python/test_snap_serving.py)
  kvpress:PRESS        a kvpress press (.venv-kvpress): snapkv, pyramidkv, streamingllm, tova, knorm,
                       expected (ExpectedAttention), adakv-expected and adakv-snapkv (AdaKV wrapping
                       the scorer). The press compresses each global layer's cache at the end of the
                       prompt's single prefill forward (kvpress's only mode), keeping --keep-tokens
                       K/V per KV head and global layer on average; decoding then runs uncompressed.

kvpress hooks every attention layer of a Gemma3ForCausalLM (its rule to skip sliding layers is
written for Gemma3ForConditionalGeneration only), so this script installs the press's own
forward hook on the global layers only, as kvpress does for the multimodal Gemma 3. Presses that
rotate with `module.rotary_emb` (ExpectedAttention) get the model's rotary for the layer's own
table: Gemma 3's rotary embedding takes the layer type, which kvpress does not pass.

    .venv-kvpress/bin/python tools/peers_eval.py --model M --samples S.jsonl --keep-tokens 1024 \\
        --methods kvpress:snapkv,kvpress:adakv-expected --out out/peers-25-kvpress.jsonl
    PYTHONPATH=python python3 tools/peers_eval.py --model M --samples S.jsonl --policy P.yaml \\
        --methods full,headwise --out out/peers-25-headwise.jsonl

Writes one JSON line per (method, sample): method, task, index, right, generated, and the global
layers' cache bytes counted in --kv-dtype (the policy's): kept_bytes after prefill (K/V a press
kept; headwise's K/V plus its h2o and snap heads' positions and scores), held_bytes (what the cache's
tensors hold: more than kept when a press masks keys instead of freeing them) and
prefill_peak_bytes (the most the global layers held at once during prefill).
"""
import argparse
import contextlib
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import torch  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
from peers_report import indexed_by_task  # noqa: E402  (the key the report pairs answers by)

GENERATED, GIVEN = -1, -2  # EvalSample::answer_source (include/headwise/eval/tasks.hpp)
PRESSES = ("snapkv", "pyramidkv", "streamingllm", "tova", "knorm", "expected", "adakv-expected", "adakv-snapkv")


def fail(msg):
    sys.exit(f"peers_eval: {msg}")


def read_samples(path):
    samples = []
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except OSError as e:
        fail(f"--samples {path}: {e.strerror}")
    for n, line in enumerate(lines, 1):
        try:
            s = json.loads(line)
            task, prompt, answer, source = s["task"], s["prompt"], s["answer"], s["answer_source"]
        except (ValueError, KeyError, TypeError) as e:
            fail(f"--samples {path}: line {n}: not a sample of `headwise-calc eval --write-samples` ({e})")
        if not prompt or not answer or (source and len(source) != len(answer)):
            fail(f"--samples {path}: line {n}: empty prompt or answer, or answer_source of another length")
        samples.append(s)
    if not samples:
        fail(f"--samples {path}: no samples")
    return samples


def global_layers(model):
    """Indices of the layers without a sliding window (the ones whose KV cache grows)."""
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    if not types:
        fail("the model's config has no layer_types: this script serves the Gemma 3 layout")
    return [i for i, t in enumerate(types) if t == "full_attention"]


def next_token(model, cache, tokens, position):
    ids = torch.tensor([tokens], dtype=torch.long)
    pos = torch.arange(position, position + len(tokens)).unsqueeze(0)
    out = model(input_ids=ids, past_key_values=cache, position_ids=pos, cache_position=pos[0], use_cache=True)
    return int(out.logits[0, -1].argmax())


def answer(model, cache, sample, prefill):
    """Greedy answer under the cache; `prefill(cache, prompt)` returns the prompt's next token."""
    prompt, want, source = sample["prompt"], sample["answer"], sample["answer_source"] or [GENERATED] * len(sample["answer"])
    produced, right = [], True
    token = prefill(cache, prompt)
    position = len(prompt)
    for i, src in enumerate(source):
        if i > 0:
            token = next_token(model, cache, [produced[-1]], position)
            position += 1
        if src == GENERATED:
            fed = token
            right = right and fed == want[i]
        else:
            fed = want[i] if src == GIVEN else produced[src]
        produced.append(fed)
    return right, produced


# ---------------------------------------------------------------------------------------------
# kvpress
class LayerRotary(torch.nn.Module):
    """Gemma 3's rotary embedding at one layer type (kvpress calls rotary_emb(x, position_ids))."""

    def __init__(self, rotary, layer_type):
        super().__init__()
        self.rotary, self.layer_type = rotary, layer_type

    def forward(self, x, position_ids):
        return self.rotary(x, position_ids, layer_type=self.layer_type)


def make_press(name, compression_ratio):
    import kvpress

    scorers = {"snapkv": kvpress.SnapKVPress, "pyramidkv": kvpress.PyramidKVPress,
               "streamingllm": kvpress.StreamingLLMPress, "tova": kvpress.TOVAPress, "knorm": kvpress.KnormPress,
               "expected": kvpress.ExpectedAttentionPress}
    if name.startswith("adakv-"):
        return kvpress.AdaKVPress(press=scorers[name[len("adakv-"):]](compression_ratio=compression_ratio))
    return scorers[name](compression_ratio=compression_ratio)


def peak_counter(layers, peak):
    """A forward hook that records the K/V tokens the global layers hold, up to the hooked one, as
    it returns (before a press compresses it: the layer's whole prompt K/V is held then)."""

    def count_peak(module, args, kwargs, output):
        cache = kwargs["past_key_values"]
        held = sum(cache.layers[i].keys.shape[1] * cache.layers[i].keys.shape[2]
                   for i in layers if i <= module.layer_idx and cache.layers[i].keys is not None
                   and cache.layers[i].keys.dim() == 4)
        peak[0] = max(peak[0], held)

    return count_peak


@contextlib.contextmanager
def press_on_global_layers(press, model, layers, peak):
    """kvpress's BasePress.__call__ for the global layers only, recording the prefill's K/V peak."""
    press.post_init_from_model(model)
    decoder = model.model
    hooks = []
    count_peak = peak_counter(layers, peak)
    try:
        for i in layers:
            attn = decoder.layers[i].self_attn
            attn.rotary_emb = LayerRotary(decoder.rotary_emb, "full_attention")
            # Before the press's hook: the layer's whole prompt K/V is held when it compresses.
            hooks.append(attn.register_forward_hook(count_peak, with_kwargs=True))
            hooks.append(attn.register_forward_hook(press.forward_hook, with_kwargs=True))
        yield
    finally:
        for h in hooks:
            h.remove()


def kept_tokens(model, cache, layers):
    """(kept, held) K/V tokens summed over the global layers' KV heads."""
    held = kept = 0
    for i in layers:
        k = cache.layers[i].keys
        held += k.shape[1] * k.shape[2]
        masked = getattr(model.model.layers[i].self_attn, "masked_key_indices", None)
        kept += k.shape[1] * k.shape[2] - (len(masked[0]) if masked is not None else 0)
    return kept, held


def kvpress_method(model, name, keep_tokens, layers, token_bytes, question_tokens=0):
    from transformers import DynamicCache

    press_name = name.split(":", 1)[1]
    if press_name not in PRESSES:
        fail(f"--methods {name}: unknown press (have: {', '.join('kvpress:' + p for p in PRESSES)})")

    def run(sample):
        prompt = sample["prompt"]
        # kvpress keeps int(k_len * (1 - ratio)) per head: this ratio keeps exactly keep_tokens.
        context = prompt[:len(prompt) - question_tokens]
        press = make_press(press_name, 1.0 - (keep_tokens + 0.5) / len(context))
        for i in layers:  # AdaKV's mask from the sample before must not apply to this one
            model.model.layers[i].self_attn.masked_key_indices = None
        peak, after = [0], []

        def prefill(cache, prompt):
            with press_on_global_layers(press, model, layers, peak):
                token = next_token(model, cache, context, 0)
            after.append(kept_tokens(model, cache, layers))  # before the answer's tokens are appended
            if question_tokens:  # kvpress's pipeline: the question runs on the compressed context
                token = next_token(model, cache, prompt[len(context):], len(context))
            return token

        right, produced = answer(model, DynamicCache(config=model.config), sample, prefill)
        (kept, held), = after
        return right, produced, kept * token_bytes, held * token_bytes, peak[0] * token_bytes

    return run


def headwise_press_method(model, policy_path, layers, token_bytes):
    """The policy through HeadwisePress: kept = the K/V tokens its heads keep after the prompt, held =
    the layers' tensors (each as long as its largest head's keep), peak = the prefill's most."""
    from transformers import DynamicCache

    from headwise_kvpress import HeadwisePress

    def run(sample):
        press = HeadwisePress(policy_path)
        peak, after = [0], []
        decoder = model.model

        def prefill(cache, prompt):
            # Prepended: each runs before the press compresses its layer.
            hooks = [decoder.layers[i].self_attn.register_forward_hook(peak_counter(layers, peak), with_kwargs=True,
                                                                        prepend=True) for i in layers]
            try:
                token = next_token(model, cache, prompt, 0)
            finally:
                for h in hooks:
                    h.remove()
            kept = sum(n for per_b in press.kept_tokens().values() for heads in per_b for n in heads)
            held = sum(cache.layers[i].keys.shape[1] * cache.layers[i].keys.shape[2] for i in layers)
            after.append((kept, held))
            return token

        with press(model):
            right, produced = answer(model, DynamicCache(config=model.config), sample, prefill)
        (kept, held), = after
        return right, produced, kept * token_bytes, held * token_bytes, peak[0] * token_bytes

    return run


# ---------------------------------------------------------------------------------------------
# headwise and full KV
def headwise_method(model, policy_path, chunk):
    from headwise_hf import HeadwiseCache, read_policy

    policy = read_policy(policy_path)

    def run(sample):
        cache = HeadwiseCache.from_policy(policy, model)
        peak, kept = [0], [0]

        def prefill(cache, prompt):
            token = None
            cache.set_prompt_length(len(prompt))  # snap heads choose at its end, not the first chunk's
            for start in range(0, len(prompt), chunk):
                token = next_token(model, cache, prompt[start:start + chunk], start)
                # K/V, the selecting heads' positions and scores and the snap heads' staged prompt: the
                # policy's bytes, in its KV dtype.
                peak[0] = max(peak[0], cache.kv_bytes() + cache.selection_bytes() + cache.staged_bytes())
            cache.end_prompt()
            kept[0] = cache.kv_bytes() + cache.selection_bytes()
            return token

        right, produced = answer(model, cache, sample, prefill)
        return right, produced, kept[0], kept[0], peak[0]

    return run


def full_method(model, layers, token_bytes):
    from transformers import DynamicCache

    def run(sample):
        right, produced = answer(model, DynamicCache(config=model.config), sample,
                                 lambda c, p: next_token(model, c, p, 0))
        n = len(sample["prompt"]) * model.config.num_key_value_heads * len(layers) * token_bytes
        return right, produced, n, n, n

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", required=True, help="JSON lines of `headwise-calc eval --write-samples`")
    ap.add_argument("--methods", required=True, help="comma-separated (see above)")
    ap.add_argument("--policy", help="headwise policy.yaml (method headwise)")
    ap.add_argument("--unconditioned-policy", help="its --no-conditioning calibration (method unconditioned)")
    ap.add_argument("--keep-tokens", type=int, default=0,
                    help="K/V tokens each press keeps per KV head and global layer (its budget)")
    ap.add_argument("--prefill-chunk", type=int, default=256, help="headwise's prefill chunk (tokens)")
    ap.add_argument("--limit", type=int, default=0, help="answer only the first N samples of each task")
    ap.add_argument("--kv-dtype", default="bfloat16",
                    help="dtype the bytes of full KV and of the presses are counted in (the policy's)")
    ap.add_argument("--question-tokens", type=int, default=0,
                    help="kvpress's pipeline protocol: the press compresses the prompt but its last N tokens (the "
                         "question), which then run on the compressed cache; 0 (default): the press compresses the "
                         "whole prompt, question included, as SnapKV stages it. headwise's eval prompts end with one "
                         "query of 4 tokens (MARKER key key SEP)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    samples = list(indexed_by_task(read_samples(args.samples)))
    if args.limit > 0:
        samples = [(i, s) for i, s in samples if i < args.limit]
    methods = [m for m in args.methods.split(",") if m]
    if args.prefill_chunk <= 0:
        fail(f"--prefill-chunk must be positive, got {args.prefill_chunk}")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa").eval()
    layers = global_layers(model)
    config = model.config.get_text_config(decoder=True)
    if any(t >= config.vocab_size for _, s in samples for t in s["prompt"] + s["answer"]):
        fail(f"--samples {args.samples}: token ids past the vocabulary of {config.vocab_size} of --model {args.model}: "
             "samples written for another model")
    try:
        dtype_size = torch.empty(0, dtype=getattr(torch, args.kv_dtype)).element_size()
    except (AttributeError, TypeError):
        fail(f"--kv-dtype {args.kv_dtype}: not a torch dtype")
    token_bytes = 2 * config.head_dim * dtype_size  # one token's K and V in one KV head
    runners = {}
    for m in methods:
        if m in ("full", "full@kvpress"):  # the second names kvpress's environment's run of it
            runners[m] = full_method(model, layers, token_bytes)
        elif m == "headwise-press":
            if not args.policy:
                fail(f"--methods {m} needs --policy")
            runners[m] = headwise_press_method(model, args.policy, layers, token_bytes)
        elif m in ("headwise", "unconditioned"):
            path = args.policy if m == "headwise" else args.unconditioned_policy
            if not path:
                fail(f"--methods {m} needs --{'policy' if m == 'headwise' else 'unconditioned-policy'}")
            runners[m] = headwise_method(model, path, args.prefill_chunk)
        elif m.startswith("kvpress:"):
            shortest = min(len(s["prompt"]) for _, s in samples)
            if not 0 < args.keep_tokens < shortest:
                fail(f"--methods {m} needs --keep-tokens (the press's budget) between 1 and the shortest prompt's "
                     f"{shortest - 1} tokens, got {args.keep_tokens}")
            if not 0 <= args.question_tokens < shortest - args.keep_tokens:
                fail(f"--question-tokens must be between 0 and the shortest prompt's {shortest} tokens less "
                     f"--keep-tokens, got {args.question_tokens}")
            runners[m] = kvpress_method(model, m, args.keep_tokens, layers, token_bytes, args.question_tokens)
        else:
            fail(f"--methods {m}: unknown method (full, headwise, unconditioned, headwise-press, kvpress:PRESS)")

    tmp = pathlib.Path(args.out + ".tmp")
    with open(tmp, "w") as out, torch.no_grad():
        for name, run in runners.items():
            t0, right_n = time.time(), 0
            for i, s in samples:
                right, produced, kept, held, peak = run(s)
                right_n += right
                out.write(json.dumps({"method": name, "task": s["task"], "index": i, "right": bool(right),
                                      "generated": produced, "kept_bytes": kept, "held_bytes": held,
                                      "prefill_peak_bytes": peak}) + "\n")
            print(f"{name}: {right_n}/{len(samples)} right, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
