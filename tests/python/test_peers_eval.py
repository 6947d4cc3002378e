#!/usr/bin/env python3
"""tools/peers_eval.py, the harness that runs kvpress's presses beside headwise (docs/results-peers.md).

Run with .venv-kvpress/bin/python (tools/setup.sh --kvpress; started by another python, it re-runs
itself under the venv's). On the gemma3_vllm fixture (sliding, global, sliding, global):
- a pruning press keeps exactly --keep-tokens K/V per KV head in every global layer, its prefill
  peak is the layers below compressed plus the whole prompt of the last one, and the sliding
  layers' caches are transformers' own, untouched (kvpress would compress them: its skip rule is
  for Gemma3ForConditionalGeneration only);
- AdaKV keeps those tokens in what attention sees but holds every prompt key (masked, not freed);
- ExpectedAttention runs on Gemma 3's two rotary tables (kvpress alone raises);
- --question-tokens compresses the context only (kvpress's pipeline), and tools/press_keeps.py
  finds the needle where the haystack plants it;
- headwise-press (HeadwisePress, python/headwise_kvpress) keeps each head's slots of a policy mixing
  window and snap heads, holds each layer as long as its largest head's keep, and peaks at the layer
  below compressed plus one whole prompt;
- the greedy answer follows answer_source as headwise's eval does: generated tokens are the model's,
  given ones the answer's, copies repeat the model's own earlier tokens (checked on a stub model).
Exit 0 on success, 1 on failure, 4 when kvpress cannot be imported, unless HEADWISE_REQUIRE_KVPRESS=1.

    test_peers_eval.py --fixtures tests/fixtures [--venv .venv-kvpress]
"""
import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from checklist import Checklist  # noqa: E402
from venv_reexec import reexec_in_venv  # noqa: E402

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def check_headwise_press(check, pe, model, layers, token_bytes, sample, prompt_tokens):
    """headwise-press on a policy with window and snap heads in both global layers (slots per head
    round_up(min(w, C), 16) at sinks 0)."""
    import tempfile

    import yaml

    from headwise_hf.policy import config_sha256

    fixture = pathlib.Path(model.config._name_or_path)
    windows = {1: [16, 40, 100, 16], 3: [40, 16, 16, 100]}
    rules = {1: ["snap", "window", "snap", "window"], 3: ["window", "snap", "snap", "window"]}
    doc = {"schema": "headwise/policy/v1", "model_name": fixture.name, "model_path": str(fixture),
           "model_fingerprint": {"config_sha256": config_sha256(fixture)}, "budget_gb": 0, "context": 512, "batch": 1,
           "dtype": "bfloat16", "block_size": 16, "sink_tokens": 0, "window_levels": [16, 40, 100, "full"],
           "per_layer_policies": [{"layer_id": l, "kv_head_windows": windows[l], "kv_head_rules": rules[l]}
                                  for l in (1, 3)]}
    with tempfile.TemporaryDirectory(prefix="headwise-press-") as d:
        path = pathlib.Path(d) / "policy.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        right, produced, kept, held, peak = pe.headwise_press_method(model, str(path), layers, token_bytes)(sample)
        slots = {l: [min(-(-w // 16) * 16, prompt_tokens) for w in windows[l]] for l in (1, 3)}
        want = sum(sum(v) for v in slots.values()) * token_bytes
        longest = {l: max(v) * len(v) for l, v in slots.items()}
        check(kept == want and held == sum(longest.values()) * token_bytes and len(produced) == 3,
              f"headwise-press: kept {kept} = {want} bytes (each head its slots), held {held} (each layer its "
              f"longest head's), answered {produced}")
        check(peak == (longest[1] + prompt_tokens * len(windows[3])) * token_bytes,
              f"headwise-press: prefill peak {peak} = layer 1 compressed + one whole prompt")
        doc["per_layer_policies"][0]["kv_head_rules"] = ["window"] * 4
        doc["per_layer_policies"][1]["kv_head_rules"] = ["window"] * 4
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        _, _, kept_w, _, _ = pe.headwise_press_method(model, str(path), layers, token_bytes)(sample)
        check(kept_w == kept, f"headwise-press with every head `window`: the same slots ({kept_w} bytes)")


def main():
    reexec_in_venv()
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    ap.add_argument("--venv", default=str(ROOT / ".venv-kvpress"))
    args = ap.parse_args()
    try:
        import kvpress  # noqa: F401
    except ImportError as e:
        if os.environ.get("HEADWISE_REQUIRE_KVPRESS") == "1":
            print(f"FAIL: kvpress cannot be imported ({e}); tools/setup.sh --kvpress installs it")
            return 1
        print(f"SKIP: kvpress cannot be imported ({e})")
        return 4
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    sys.path.insert(0, str(ROOT / "tools"))
    import peers_eval as pe

    torch.manual_seed(0)
    check = Checklist()

    model = AutoModelForCausalLM.from_pretrained(pathlib.Path(args.fixtures) / "gemma3_vllm", dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    config = model.config
    layers = pe.global_layers(model)
    check(layers == [1, 3], f"global layers of the fixture: {layers}")
    sliding = [i for i in range(config.num_hidden_layers) if i not in layers]
    token_bytes = 2 * config.head_dim * 2
    kv_heads = config.num_key_value_heads
    T, keep = 300, 40
    prompt = [int(t) for t in torch.randint(20, config.vocab_size, (T,))]
    sample = {"task": "needle_single", "prompt": prompt, "answer": [30, 31, 32], "answer_source": []}

    with torch.no_grad():
        plain = DynamicCache(config=config)
        pe.next_token(model, plain, prompt, 0)
        for press in ("snapkv", "streamingllm", "knorm", "tova", "expected", "pyramidkv"):
            right, produced, kept, held, peak = pe.kvpress_method(model, f"kvpress:{press}", keep, layers,
                                                                  token_bytes)(sample)
            want = keep * kv_heads * len(layers) * token_bytes
            if press == "pyramidkv":  # its own per-layer budgets: their mean is the budget, up to rounding
                check(abs(kept - want) <= len(layers) * kv_heads * token_bytes, f"{press}: kept {kept} ~ {want}")
            else:
                check(kept == want and held == want, f"{press}: kept {kept} = held {held} = {want} bytes")
                check(peak == (keep + T) * kv_heads * token_bytes,
                      f"{press}: prefill peak {peak} = the layer below compressed + one whole prompt")
            check(len(produced) == 3, f"{press}: answered {produced}")
        # kvpress's pipeline protocol (--question-tokens): the press compresses the context only, and the
        # question runs on the compressed cache.
        q = 4
        _, produced, kept, held, peak = pe.kvpress_method(model, "kvpress:snapkv", keep, layers, token_bytes,
                                                          question_tokens=q)(sample)
        want = keep * kv_heads * len(layers) * token_bytes
        check(kept == want and peak == (keep + T - q) * kv_heads * token_bytes and len(produced) == 3,
              f"--question-tokens {q}: kept {kept} = {want}, peak {peak} = the layer below + the context only")
        # The sliding layers are transformers' own under a press.
        cache = DynamicCache(config=config)
        press = pe.make_press("snapkv", 1.0 - (keep + 0.5) / T)
        with pe.press_on_global_layers(press, model, layers, [0]):
            pe.next_token(model, cache, prompt, 0)
        for i in sliding:
            check(torch.equal(cache.layers[i].keys, plain.layers[i].keys), f"sliding layer {i} untouched by the press")
        for i in layers:
            check(cache.layers[i].keys.shape[2] == keep, f"global layer {i} keeps {cache.layers[i].keys.shape[2]}")
        # AdaKV: the budget in what attention sees, every key held.
        _, _, kept, held, peak = pe.kvpress_method(model, "kvpress:adakv-expected", keep, layers, token_bytes)(sample)
        full = T * kv_heads * len(layers) * token_bytes
        check(kept == keep * kv_heads * len(layers) * token_bytes and held == full and peak == full,
              f"adakv-expected: kept {kept}, held {held} = full {full}, peak {peak}")

    check_headwise_press(check, pe, model, layers, token_bytes, sample, T)

    # tools/press_keeps.py finds the needle's value tokens after the planted copy of the question.
    import press_keeps
    planted = {"prompt": [9, 9, 64, 3, 4, 65, 7, 8, 6, 9, 9, 64, 3, 4, 65], "answer": [7, 8, 6]}
    check(press_keeps.needle_positions(planted, 4) == {6, 7, 8},
          f"press_keeps: needle at {sorted(press_keeps.needle_positions(planted, 4))}")

    # Greedy answers follow answer_source (a stub whose next token is the last input token + 1).
    class Stub:
        def __call__(self, input_ids, **kwargs):
            logits = torch.zeros(1, input_ids.shape[1], 100)
            logits[0, -1, (int(input_ids[0, -1]) + 1) % 100] = 1
            return type("Out", (), {"logits": logits})

    chain = {"prompt": [5, 6, 7], "answer": [8, 9, 10, 50, 8, 9, 51, 52, 53, 54],
             "answer_source": [-1, -1, -1, -2, 0, 1, -2, -1, -1, -1]}
    right, produced = pe.answer(Stub(), None, chain, lambda cache, p: pe.next_token(Stub(), cache, p, 0))
    check(produced == [8, 9, 10, 50, 8, 9, 51, 52, 53, 54] and right, f"chain answer {produced}")
    chain["answer"][8] = 0
    right, _ = pe.answer(Stub(), None, chain, lambda cache, p: pe.next_token(Stub(), cache, p, 0))
    check(not right, "a wrong generated hop makes the chain wrong")
    return check.exit_status()


if __name__ == "__main__":
    sys.exit(main())
