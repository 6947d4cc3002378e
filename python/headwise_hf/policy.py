"""Reading a headwise policy (policy.yaml, schema headwise/policy/v1) for the transformers cache.

Only what serving needs is read: the serving shape (context, dtype, block size, sink tokens,
state dtype when the policy records one), the model fingerprint, each global layer's per-KV-head
windows and keep rules (`kv_head_rules`: `window`, `h2o` for a head that keeps heavy hitters
in its slots, or `snap` for a head that keeps what the prompt's last queries attend to most).
headwise's C++ reader is the strict one; this one checks what would make a cache wrong.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Optional

import torch
import yaml

SCHEMA = "headwise/policy/v1"
FULL = None  # a `full` window
WINDOW, H2O, SNAP = "window", "h2o", "snap"  # keep rules (kv_head_rules; docs/keep-rules.md)
KEEP_RULES = (WINDOW, H2O, SNAP)

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    "float8_e5m2": getattr(torch, "float8_e5m2", None),
}
# The dtypes a policy may keep its recurrent/conv states in (headwise's policy::parse_state_dtype).
_STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyError(ValueError):
    """A policy that cannot apply to this model; the message names the file and field."""


@dataclasses.dataclass
class Policy:
    path: str
    model_name: str
    model_path: str
    config_sha256: str
    context: int
    batch: int
    dtype: str
    block_size: int
    sink_tokens: int
    # The dtype every recurrent/conv state is kept in between forward calls; None when the policy
    # has no `state_dtype` (made before the field: each state in its native dtype, i.e. conv states
    # in the checkpoint's dtype, recurrent/SSM states as the model's own rule returns them).
    state_dtype: Optional[str]
    # layer id -> one window per KV head (None = full)
    windows: dict[int, list[Optional[int]]]
    memory: dict
    # layer id -> one keep rule per KV head, for the layers that list kv_head_rules
    rules: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    # The tensor-parallel size the windows were calibrated to shard over (calibrate
    # --tensor-parallel-size); None: not recorded (calibrated without the constraint).
    tensor_parallel_size: Optional[int] = None

    @property
    def kv_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def state_torch_dtype(self) -> Optional[torch.dtype]:
        return None if self.state_dtype is None else _STATE_DTYPES[self.state_dtype]

    def heads_with_rule(self, rule: str) -> dict[int, list[int]]:
        """layer id -> the KV heads whose keep rule is `rule` (layers without one left out)."""
        out = {}
        for layer, rules in sorted(self.rules.items()):
            heads = [h for h, r in enumerate(rules) if r == rule]
            if heads:
                out[layer] = heads
        return out

    def h2o_heads(self) -> dict[int, list[int]]:
        """layer id -> the KV heads whose rule is h2o (layers without one left out)."""
        return self.heads_with_rule(H2O)

    def snap_heads(self) -> dict[int, list[int]]:
        """layer id -> the KV heads whose rule is snap (layers without one left out)."""
        return self.heads_with_rule(SNAP)


def _window(value, where: str) -> Optional[int]:
    if value == "full":
        return FULL
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PolicyError(f"{where}: window {value!r} is neither a positive token count nor `full`")
    return value


def read_policy(path: str | os.PathLike) -> Policy:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise PolicyError(f"{path}: cannot read the policy ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise PolicyError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise PolicyError(f"{path}: schema: expected {SCHEMA}")

    def field(name, kind):
        if name not in doc or not isinstance(doc[name], kind) or isinstance(doc[name], bool):
            raise PolicyError(f"{path}: {name}: missing or not a {kind.__name__}")
        return doc[name]

    dtype = field("dtype", str)
    if _DTYPES.get(dtype) is None:
        raise PolicyError(f"{path}: dtype: {dtype} is not a KV dtype this torch has ({', '.join(k for k, v in _DTYPES.items() if v is not None)})")
    state_dtype = doc.get("state_dtype")
    if state_dtype is not None and state_dtype not in _STATE_DTYPES:
        raise PolicyError(f"{path}: state_dtype: {state_dtype!r} is not a state dtype ({', '.join(_STATE_DTYPES)})")
    context, block, sinks = field("context", int), field("block_size", int), field("sink_tokens", int)
    if context <= 0 or block <= 0 or sinks < 0:
        raise PolicyError(f"{path}: context, block_size must be positive and sink_tokens >= 0")
    windows: dict[int, list[Optional[int]]] = {}
    rules: dict[int, list[str]] = {}
    for i, entry in enumerate(field("per_layer_policies", list)):
        where = f"{path}: per_layer_policies[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("layer_id"), int):
            raise PolicyError(f"{where}: layer_id missing")
        heads = entry.get("kv_head_windows")
        if not isinstance(heads, list) or not heads:
            raise PolicyError(f"{where}: kv_head_windows missing or empty")
        if entry["layer_id"] in windows:
            raise PolicyError(f"{where}: layer {entry['layer_id']} appears twice")
        windows[entry["layer_id"]] = [_window(w, f"{where}.kv_head_windows") for w in heads]
        if "kv_head_rules" in entry:
            layer_rules = entry["kv_head_rules"]
            if not isinstance(layer_rules, list) or len(layer_rules) != len(heads):
                raise PolicyError(f"{where}.kv_head_rules: must list one rule per KV head ({len(heads)})")
            for r in layer_rules:
                if r not in KEEP_RULES:
                    raise PolicyError(f"{where}.kv_head_rules: {r!r} is not a keep rule ({', '.join(KEEP_RULES)})")
            rules[entry["layer_id"]] = list(layer_rules)
    tp = doc.get("tensor_parallel_size")
    if tp is not None and (not isinstance(tp, int) or isinstance(tp, bool) or tp < 1):
        raise PolicyError(f"{path}: tensor_parallel_size: must be a positive integer, got {tp!r}")
    fp = doc.get("model_fingerprint") or {}
    return Policy(
        path=path,
        model_name=str(doc.get("model_name", "")),
        model_path=str(doc.get("model_path", "")),
        config_sha256=str(fp.get("config_sha256", "") or ""),
        context=context,
        batch=int(doc.get("batch", 1)),
        dtype=dtype,
        block_size=block,
        sink_tokens=sinks,
        state_dtype=state_dtype,
        windows=windows,
        memory=dict(doc.get("memory") or {}),
        rules=rules,
        tensor_parallel_size=tp,
    )


def config_sha256(model_dir: str | os.PathLike) -> Optional[str]:
    """sha256 of a model folder's config.json bytes (the policy's model_fingerprint.config_sha256)."""
    path = os.path.join(os.fspath(model_dir), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def round_up(n: int, block: int) -> int:
    return (n + block - 1) // block * block


def head_slots(window: Optional[int], sinks: int, length: int, block: int) -> int:
    """Slots of one KV head holding `length` positions: round_up(min(w + S, length), block)
    (full: round_up(length, block)). At length = the policy's context this is the memory model's
    global_head_slots, so the bytes equal mem-estimate's."""
    tokens = length if window is FULL else min(window + sinks, length)
    return round_up(tokens, block)
