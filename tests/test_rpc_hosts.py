"""A model split across real hosts on one machine: each worker in its own network namespace, joined to
this one by a veth pair, in a memory cgroup smaller than the model (tests/rpc_hosts.py). Needs root."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import run_python
from deepseek_cpu.runtime import rpc
from rpc_hosts import Worker, hosts
from served import Served

PORT = 50052
CGROUP_LIMIT = 900 << 20   # each host: less than the model (0.93 GiB), more than its share
OFFER = "800M"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("hosts") / "v2-lite-3-layers-q4_0.gguf"
    subprocess.run([sys.executable, "-m", "deepseek_cpu", "synth", "--layers", "3", "--quant", "q4_0",
                    "--tokenizer", "bytes", "--quiet", str(path)], check=True, capture_output=True)
    assert os.path.getsize(path) > CGROUP_LIMIT
    return str(path)


@pytest.fixture
def two_hosts(tmp_path):
    with hosts(2) as hs:
        workers = []
        for i, h in enumerate(hs):
            h.limit_memory(CGROUP_LIMIT)
            workers.append(Worker(h.addr, PORT, ["--mem", OFFER, "--no-cache"], netns=h.name, cgroup=h.cgroup,
                                  env={rpc.ENV_TIMEOUT: "3"}, log=tmp_path / f"worker{i}.log"))
        try:
            for w in workers:
                w.start()
            yield hs, workers
        finally:
            for w in workers:
                w.stop()


def _logits(model, **kw):
    from deepseek_cpu import Llama
    llm = Llama(model, n_ctx=64, logits_all=True, verbose=False, **kw)
    try:
        llm.eval([3, 17, 42, 99, 120, 7, 250, 31])
        return np.asarray(llm.scores[:8]).copy(), getattr(llm, "rpc_split", None)
    finally:
        llm.close()


def test_a_model_larger_than_each_host_runs_split_with_the_single_process_logits(model, two_hosts):
    hs, workers = two_hosts
    ref, _ = _logits(model)
    got, split = _logits(model, rpc_servers=",".join(w.endpoint for w in workers))
    assert all(w.units for w in split.workers)
    assert all(w.bytes < CGROUP_LIMIT for w in split.workers)
    np.testing.assert_array_equal(got, ref)
    for h in hs:  # each host held its share within its limit (the kernel enforces it; this reads it back)
        peak = int((h.cgroup / "memory.max_usage_in_bytes").read_text())
        assert peak <= CGROUP_LIMIT


def test_an_unreachable_host_is_an_error_within_the_bound(model, two_hosts):
    """The second host's link goes down mid-generation: no reset reaches the client, only silence;
    keepalive and TCP_USER_TIMEOUT (DEEPSEEK_CPU_RPC_TIMEOUT=3) turn it into RpcWorkerLost."""
    hs, workers = two_hosts
    code = textwrap.dedent(f"""
        import subprocess, time
        from deepseek_cpu import Llama
        from deepseek_cpu.runtime.rpc import RpcWorkerLost
        llm = Llama({model!r}, n_ctx=512, verbose=False, rpc_servers={",".join(w.endpoint for w in workers)!r})
        llm.eval([3, 17, 42])
        subprocess.run(["ip", "netns", "exec", {hs[1].name!r}, "ip", "link", "set", {hs[1].veth + "p"!r}, "down"], check=True)
        t0 = time.monotonic()
        try:
            for _ in range(400):
                llm.eval([5])
            print("NO ERROR")
        except RpcWorkerLost as e:
            print("LOST", round(time.monotonic() - t0, 2), e)
    """)
    r = run_python(code, env_extra={rpc.ENV_TIMEOUT: "3"}, timeout=120)
    assert "LOST" in r.stdout, r.stdout + r.stderr[-3000:]
    seconds = float(r.stdout.split("LOST", 1)[1].split()[0])
    assert seconds < 3 * 2, r.stdout


def test_serve_over_two_hosts_survives_a_lost_worker(model, two_hosts, tmp_path):
    openai = pytest.importorskip("openai")
    hs, workers = two_hosts
    srv = Served(model, tmp_path / "serve.log", "--rpc", ",".join(w.endpoint for w in workers), parallel=1, ctx=512)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        r = client.completions.create(model="tiny", prompt="hello", max_tokens=8)
        assert r.usage.completion_tokens == 8  # (random weights, a byte tokenizer: the text may be empty)

        # kill -9 the second host's server mid-stream: the stream ends in an error, promptly
        t0, n = None, 0
        with pytest.raises((openai.APIError, Exception)):
            for _ in client.completions.create(model="tiny", prompt="hello", max_tokens=400, stream=True):
                n += 1
                if n == 10:
                    workers[1].stop()  # the whole worker: it stays away until started again
                    t0 = time.monotonic()
        assert t0 is not None and time.monotonic() - t0 < 10

        # while it is gone: 503 (not a hang, not a connection refused after the stand-in is up)
        deadline, status = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            try:
                client.completions.create(model="tiny", prompt="hi", max_tokens=2)
            except openai.APIStatusError as e:
                status = e.status_code
                break
            except openai.APIConnectionError:
                time.sleep(0.2)
        assert status == 503

        workers[1].start()
        deadline = time.monotonic() + 120
        while True:
            try:
                r = client.completions.create(model="tiny", prompt="hello", max_tokens=8)
                break
            except (openai.APIStatusError, openai.APIConnectionError):
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(0.5)
        assert r.usage.completion_tokens == 8
        assert "restarting the server" in (tmp_path / "serve.log").read_text()
    finally:
        srv.stop()
