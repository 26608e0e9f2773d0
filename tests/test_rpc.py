"""Models split across hosts (runtime/rpc.py, patches/rpc/): workers on loopback here; as separate
hosts (network namespaces, memory cgroups) in test_rpc_hosts.py."""
from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest

from deepseek_cpu.runtime import rpc
from rpc_hosts import free_port, loopback_workers, wait_ready

# waits for an event (a restart, a freed slot) give up after this long: a hang guard, never a
# claim about speed (that belongs in benchmarks)
HANG_GUARD = 120
TOKENS = [3, 17, 42, 99, 120, 7, 250, 31, 64, 128, 200, 11]


@pytest.fixture(scope="module")
def f32_model(converted):
    return str(converted("v2_lite", "f32"))


def _logits(model, **kw):
    from deepseek_cpu import Llama
    llm = Llama(model, n_ctx=64, logits_all=True, verbose=False, **kw)
    try:
        llm.eval(TOKENS)
        return np.asarray(llm.scores[:len(TOKENS)]).copy(), getattr(llm, "rpc_split", None)
    finally:
        llm.close()


# ---- endpoints and the split ----

def test_endpoints_are_parsed_and_checked():
    assert rpc.parse_endpoints("10.0.0.2:6000, node-b") == ["10.0.0.2:6000", f"node-b:{rpc.DEFAULT_PORT}"]
    assert rpc.parse_endpoints(["a:1", "b:2"]) == ["a:1", "b:2"]
    for bad in ("", "a:0", "a:70000", "a b:1", "a:1,a:1"):
        with pytest.raises(rpc.RpcError):
            rpc.parse_endpoints(bad)


def test_split_follows_the_memory_each_host_offers():
    gib = 1 << 30
    sizes = [gib] * 10 + [gib // 2]  # ten layers, then the output
    s = rpc.plan_split(10, sizes, 0, [("a:1", 8 * gib), ("b:1", 4 * gib)])
    assert s.local.units == [10]  # the output stays here, beside the embeddings
    assert s.workers[0].units + s.workers[1].units == list(range(10))  # contiguous, in order
    for w in s.workers:
        assert w.bytes <= rpc.usable(w.offered)
    assert len(s.workers[0].units) > len(s.workers[1].units)  # roughly 2:1
    assert s.n_gpu_layers == 11 and s.tensor_split == [float(len(s.workers[0].units)), float(len(s.workers[1].units) + 1)]
    assert "a:1: layers 0-" in s.describe() and "this host: output" in s.describe()

    local = rpc.plan_split(10, sizes, 3 * gib, [("a:1", 8 * gib), ("b:1", 8 * gib)])
    layers = local.local.units[:-1]
    assert layers == list(range(len(layers))) and 0 < len(layers) <= 2 and local.local.units[-1] == 10
    assert local.n_gpu_layers == 11 - len(layers)

    with pytest.raises(rpc.RpcError, match="need 10.00 GiB"):
        rpc.plan_split(10, sizes, 0, [("a:1", 4 * gib), ("b:1", 4 * gib)])


def test_a_tiny_offer_keeps_half_for_compute():
    assert rpc.usable(64 << 20) == 32 << 20
    assert rpc.usable(8 << 30) == (8 << 30) - int((8 << 30) * 0.1)


# ---- a split model runs as a single process would ----

def test_split_over_two_workers_gives_the_single_process_logits(f32_model, tmp_path):
    ref, _ = _logits(f32_model)
    with loopback_workers(2, ["--mem", "64M", "--no-cache"], log_dir=tmp_path) as ws:
        eps = ",".join(w.endpoint for w in ws)
        got, split = _logits(f32_model, rpc_servers=eps)
        assert all(w.units for w in split.workers)
        np.testing.assert_array_equal(got, ref)
        # this host keeping the first layer(s): the same logits
        got, split = _logits(f32_model, rpc_servers=eps, rpc_local="40M")
        assert len(split.local.units) > 1  # a layer and the output
        np.testing.assert_array_equal(got, ref)


def test_a_quantized_split_runs_the_repacked_kernels(tmp_path):
    """A worker repacks the weights the local loader would (patches/rpc/rpc-worker-repacks-weights.patch):
    its logits equal a local load's bit for bit, where weights as sent (the plain buffer) do not."""
    model = tmp_path / "q4.gguf"
    subprocess.run([sys.executable, "-m", "deepseek_cpu", "synth", "--layers", "2", "--quant", "q4_0",
                    "--tokenizer", "bytes", "--quiet", str(model)], check=True, capture_output=True)
    ref, _ = _logits(str(model))
    with loopback_workers(1, ["--mem", "2G", "--no-cache"], log_dir=tmp_path) as (w,):
        got, _ = _logits(str(model), rpc_servers=w.endpoint)
        np.testing.assert_array_equal(got, ref)
        assert "repacked at upload" in (tmp_path / "worker0.log").read_text()
    with loopback_workers(1, ["--mem", "2G", "--no-cache"], env={"DEEPSEEK_CPU_RPC_REPACK": "0"}) as (w,):
        plain, _ = _logits(str(model), rpc_servers=w.endpoint)
        assert not np.array_equal(plain, ref)  # other kernels: close, not bit-identical
        assert (plain.argmax(1) == ref.argmax(1)).mean() > 0.8


# ---- failures: clear errors within a bound, never an abort or a hang ----

def test_a_worker_killed_mid_generation_is_a_clear_error_then_a_reload_works(f32_model, tmp_path):
    from deepseek_cpu import Llama
    with loopback_workers(2, ["--mem", "64M", "--no-cache"], log_dir=tmp_path) as ws:
        eps = ",".join(w.endpoint for w in ws)
        llm = Llama(f32_model, n_ctx=256, verbose=False, rpc_servers=eps)
        llm.eval(TOKENS)
        killed = ws[1].server_pid()
        os.kill(killed, signal.SIGKILL)
        with pytest.raises(rpc.RpcWorkerLost, match=ws[1].endpoint):
            for _ in range(50):
                llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        llm.close()
        # the worker's supervisor restarts its server (after a delay: waited for, not slept through);
        # then the model loads and runs again
        wait_ready(ws[1].endpoint, ws[1].proc, timeout=HANG_GUARD)
        assert ws[1].server_pid() != killed
        got, _ = _logits(f32_model, rpc_servers=eps)
        ref, _ = _logits(f32_model)
        np.testing.assert_array_equal(got, ref)


def test_unreachable_and_busy_workers_are_clear_errors(f32_model, tmp_path, monkeypatch):
    from deepseek_cpu import Llama
    with pytest.raises(rpc.RpcError, match="not reachable"):
        Llama(f32_model, verbose=False, rpc_servers=f"127.0.0.1:{free_port()}")
    monkeypatch.setenv(rpc.ENV_TIMEOUT, "2")
    with loopback_workers(1, ["--mem", "64M", "--no-cache"]) as (w,):
        holder = Llama(f32_model, n_ctx=64, verbose=False, rpc_servers=w.endpoint)
        # the probe's own timeout (2 s) is what ends the wait: an error, not a hang
        with pytest.raises(rpc.RpcError, match="busy with another client"):
            rpc.probe(w.endpoint)
        holder.close()


def test_a_worker_survives_garbage_and_silent_clients(f32_model):
    """Random bytes, random commands after a valid handshake and a client that never speaks: the
    worker's server keeps running (same process) and then serves a model correctly."""
    with loopback_workers(1, ["--mem", "64M", "--no-cache"], env={rpc.ENV_TIMEOUT: "2"}) as (w,):
        pid = w.server_pid()
        host, port = w.endpoint.split(":")
        rnd = random.Random(7)
        for _ in range(100):
            with socket.create_connection((host, int(port)), timeout=2) as s:
                s.sendall(rnd.randbytes(rnd.randint(1, 2048)))
        hello = struct.pack("<BQ", rpc.CMD_HELLO, rpc.CONN_CAPS_SIZE) + bytes(rpc.CONN_CAPS_SIZE)
        for _ in range(200):
            with socket.create_connection((host, int(port)), timeout=2) as s:
                s.sendall(hello)
                s.recv(64)
                payload = rnd.randbytes(rnd.choice([0, 4, 8, 16, 24, 400, 4000]))
                s.sendall(struct.pack("<BQ", rnd.randint(0, 19), len(payload)) + payload)
                s.settimeout(0.1)
                try:
                    s.recv(64)
                except OSError:
                    pass
        silent = socket.create_connection((host, int(port)))  # holds the one client slot, says nothing
        # the handshake timeout (2 s) frees it: wait until a probe is answered while it stays open
        wait_ready(w.endpoint, w.proc, timeout=HANG_GUARD)
        assert w.server_pid() == pid
        got, _ = _logits(f32_model, rpc_servers=w.endpoint)
        silent.close()
        ref, _ = _logits(f32_model)
        np.testing.assert_array_equal(got, ref)


def _raw(endpoint, cmd, payload, reply):
    host, port = endpoint.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        rpc._call(s, rpc.CMD_HELLO, bytes(rpc.CONN_CAPS_SIZE), 4 + rpc.CONN_CAPS_SIZE)
        return rpc._call(s, cmd, payload, reply)


def test_a_worker_refuses_buffers_beyond_its_offer():
    with loopback_workers(1, ["--mem", "64M", "--no-cache"]) as (w,):
        assert rpc.probe(w.endpoint).free == 64 << 20
        ptr, size = struct.unpack("<QQ", _raw(w.endpoint, 0, struct.pack("<IQ", 0, 65 << 20), 16))  # ALLOC_BUFFER
        assert (ptr, size) == (0, 0)
        ptr, size = struct.unpack("<QQ", _raw(w.endpoint, 0, struct.pack("<IQ", 0, 16 << 20), 16))
        assert ptr != 0 and size >= 16 << 20


def test_the_weight_cache_spares_resending_and_survives_a_damaged_entry(tmp_path):
    """Weights over 1 MiB go by hash once cached; a cache file cut short is detected (its hash),
    removed and sent again, and the logits stay right."""
    model = tmp_path / "q4.gguf"
    subprocess.run([sys.executable, "-m", "deepseek_cpu", "synth", "--layers", "2", "--quant", "q4_0",
                    "--tokenizer", "bytes", "--quiet", str(model)], check=True, capture_output=True)
    ref, _ = _logits(str(model))
    cache = tmp_path / "cache"
    with loopback_workers(1, ["--mem", "2G", "--cache", str(cache)], log_dir=tmp_path) as (w,):
        got, _ = _logits(str(model), rpc_servers=w.endpoint)
        np.testing.assert_array_equal(got, ref)
        entries = sorted(p for p in cache.iterdir() if p.is_file())
        assert len(entries) >= 3 and not any(".tmp" in p.name for p in entries)
        victim = max(entries, key=lambda p: p.stat().st_size)
        victim.write_bytes(victim.read_bytes()[:1000])
        got, _ = _logits(str(model), rpc_servers=w.endpoint)
        np.testing.assert_array_equal(got, ref)
        assert "damaged" in (tmp_path / "worker0.log").read_text()
        assert victim.stat().st_size > 1000  # written again, whole


def test_worker_command_line(tmp_path):
    from click.testing import CliRunner
    from deepseek_cpu.cli import cli
    r = CliRunner().invoke(cli, ["rpc-worker", "--dry-run", "--mem", "1G", "--port", "6001", "--cache", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert "DEEPSEEK_CPU_RPC_MEM=1073741824" in r.output and "-H 127.0.0.1 -p 6001" in r.output and r.output.rstrip().endswith("-c")
    r = CliRunner().invoke(cli, ["rpc-worker", "--dry-run", "--no-cache"])
    assert r.exit_code == 0 and "-c" not in r.output.split()


def test_serve_passes_the_split_to_llama_server(f32_model):
    from click.testing import CliRunner
    from deepseek_cpu.cli import cli
    with loopback_workers(2, ["--mem", "64M", "--no-cache"]) as ws:
        eps = ",".join(w.endpoint for w in ws)
        r = CliRunner().invoke(cli, ["serve", f32_model, "--rpc", eps, "--dry-run"])
        assert r.exit_code == 0, r.output
        line = r.output.strip().splitlines()[-1]
        assert "DEEPSEEK_CPU_RPC_LOST_EXIT=75" in line and f"--rpc {eps}" in line
        assert "-ngl 4 --tensor-split" in line and "--override-tensor" in line
        assert "split over 2 worker(s)" in r.output
        r = CliRunner().invoke(cli, ["serve", f32_model, "--rpc", eps, "--mem-budget", "1G", "--dry-run"])
        assert r.exit_code != 0 and "cannot be combined" in r.output


def test_a_worker_whose_port_is_taken_exits_with_an_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "rpc-worker", "--port", str(port), "--no-cache"],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "exits at start" in r.stderr


def test_workers_used_once_leave_later_loads_alone(f32_model):
    """A worker used by one model is not a device of later loads in the process: llama_cpp.Llama
    (not ours) loads on the CPU after the worker is gone, where a registered device would abort."""
    with loopback_workers(1, ["--mem", "64M", "--no-cache"]) as (w,):
        _logits(f32_model, rpc_servers=w.endpoint)
    r = subprocess.run([sys.executable, "-c", f"""
import llama_cpp
from deepseek_cpu import Llama
from rpc_hosts import loopback_workers
with loopback_workers(1, ["--mem", "64M", "--no-cache"]) as (w,):
    Llama({f32_model!r}, n_ctx=64, verbose=False, rpc_servers=w.endpoint).close()
llm = llama_cpp.Llama({f32_model!r}, n_ctx=64, verbose=False)
llm.eval([3, 17])
print("OK")
"""], capture_output=True, text=True, timeout=120, cwd=os.path.dirname(__file__),
                       env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)})
    assert "OK" in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_lost_worker_stand_in_answers_503_where_the_server_listened(host):
    """While a lost worker comes back, `serve --rpc`'s stand-in answers 503 on the server's own
    address: an IPv6 host (`--host ::1`) included (it bound IPv4 only and failed there)."""
    import socket
    import urllib.error
    import urllib.request
    from deepseek_cpu.runtime import rpc_serve
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    server = rpc_serve.stand_in(host, port)
    try:
        url_host = f"[{host}]" if ":" in host else host
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{url_host}:{port}/v1/models", timeout=10)
        assert e.value.code == 503 and b"unavailable" in e.value.read()
    finally:
        server.shutdown()
        server.server_close()
