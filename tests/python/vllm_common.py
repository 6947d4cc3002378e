"""What the vLLM tests share (test_vllm_plugin.py, test_vllm_server.py): policies written for a
fixture, the fixture as vLLM may load it, and headwise's own reference logits."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys

# The CPU backend's block size when none is asked (vLLM logs "Setting kv cache block size to 128");
# the hybrids' attention block is aligned up from it to hold a state page.
CPU_BLOCK_SIZE = 128


def keep_vllm_files_in(tmp):
    """What vLLM would leave behind for good, kept to the test's own temporary folder or not
    written. Its ZeroMQ IPC sockets, named after a fresh uuid under VLLM_RPC_BASE_PATH (the
    system's temporary folder by default): every engine a test starts would add one to /tmp. And a
    compiled engine's AOT artefacts under ~/.cache/vllm/torch_compile_cache (about 4 MB each): the
    key hashes the model's path, a fresh temporary folder in every run, so they were never read
    again. Call before the first engine starts; servers started as subprocesses inherit both."""
    os.environ["VLLM_RPC_BASE_PATH"] = str(tmp)
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"


def run(cmd, expect_ok=True, env=None, timeout=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    if expect_ok and r.returncode != 0:
        raise SystemExit(f"FAIL {' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r


def write_policy(path, fixture_dir, windows, *, rules=None, sinks=0, context=4096, dtype="float32"):
    """A policy for fixture_dir: windows {layer: [window or None (full), ...]} per KV head."""
    name = lambda w: "full" if w is None else str(w)  # noqa: E731
    sha = hashlib.sha256((pathlib.Path(fixture_dir) / "config.json").read_bytes()).hexdigest()
    lines = ["schema: headwise/policy/v1", f'model_name: "{pathlib.Path(fixture_dir).name}"',
             f'model_path: "{fixture_dir}"', "model_fingerprint:", f"  config_sha256: {sha}", "budget_gb: 0",
             f"context: {context}", "batch: 1", f"dtype: {dtype}", "block_size: 16", f"sink_tokens: {sinks}",
             "window_levels: [64, 256, 1024, full]", "per_layer_policies:"]
    for layer, heads in sorted(windows.items()):
        lines += [f"  - layer_id: {layer}", f"    kv_head_windows: [{', '.join(name(w) for w in heads)}]"]
        if rules and layer in rules:
            lines += [f"    kv_head_rules: [{', '.join(rules[layer])}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def model_view(fixture_dir, tmp):
    """vLLM loads every *.safetensors of a folder; the fixtures also hold reference.safetensors."""
    view = tmp / "models" / fixture_dir.name
    view.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (fixture_dir / name).exists() and not (view / name).exists():
            (view / name).symlink_to(fixture_dir / name)
    return view


def reference_logprobs(cli, fixture, tokens, tmp, policy=None):
    """log-softmax (float64) of `headwise-calc forward [--policy]` over `tokens`: [len(tokens), vocab]."""
    import torch
    from safetensors.torch import load_file

    ids = tmp / "ref_ids.json"
    ids.write_text(json.dumps(tokens))
    out = tmp / "ref.safetensors"
    run([cli, "forward", "--model", fixture, "--tokens", ids, "-o", out, "-q"] + (["--policy", policy] if policy else []))
    return torch.log_softmax(load_file(str(out))["logits"].double(), dim=-1)


def is_hybrid(fixture_dir) -> bool:
    """A gated-DeltaNet hybrid (linear_attention layers with recurrent states)."""
    config = json.loads((pathlib.Path(fixture_dir) / "config.json").read_text())
    return "linear_attention" in (config.get("layer_types") or [])


def skip_without_vllm(error: ImportError):
    """Without the vLLM environment: ctest's skip (exit 4), or a failure where CI requires it."""
    if os.environ.get("HEADWISE_REQUIRE_VLLM") == "1":
        print(f"FAIL vLLM environment required (HEADWISE_REQUIRE_VLLM=1) but not importable: {error}")
        sys.exit(1)
    print(f"SKIP: {error} (tools/setup.sh --vllm creates .venv-vllm)")
    sys.exit(4)
