"""Authenticated RPC (runtime/rpc_auth.py; the worker's side and the engine's connections in
patches/files/ggml/src/ggml-rpc/dsc-rpc-auth.cpp, hooked by patches/rpc/rpc-worker-shared-key.patch):
a worker with a key serves only clients that prove it and proves it to them, a worker without one
stays on loopback; and a short fuzz of a worker's command parser. Everything over loopback."""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import random
import re
import secrets
import socket
import struct
import threading
import time

import numpy as np
import pytest

from deepseek_cpu.runtime import rpc, rpc_auth
from deepseek_cpu.runtime.rpc_socket import recv_exact as _recv_exact
from rpc_hosts import loopback_workers, wait_ready
from test_rpc import _logits

# a connection the worker neither answers nor closes within this long is a hang (a guard, not a speed claim)
HANG_GUARD = 10
# the fuzz: at most this many messages or seconds, whichever comes first
FUZZ_MESSAGES, FUZZ_SECONDS = 10_000, 30
# the worker's debug log (GGML_RPC_DEBUG) names each command it runs: "[alloc_buffer] ..."
RAN_A_COMMAND = re.compile(r"^\[(hello|alloc_buffer|get_alignment|get_max_size|buffer_get_base|free_buffer|buffer_clear|"
                           r"set_tensor|set_tensor_hash|get_tensor|copy_tensor|graph_compute|graph_recompute|"
                           r"get_device_memory|init_tensor|get_alloc_size|memset_tensor)\]", re.M)


def _key_file(path, text, mode=0o600):
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.fixture(scope="module")
def f32_model(converted):
    return str(converted("v2_lite", "f32"))


@pytest.fixture(scope="module")
def reference(f32_model):
    return _logits(f32_model)[0]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two key files: A (with a comment, as a user writes one) and B."""
    d = tmp_path_factory.mktemp("keys")
    return (_key_file(d / "a.key", f"# the workers' key\n{secrets.token_hex(32)}\n"),
            _key_file(d / "b.key", secrets.token_hex(32)))


class WorkerLog:
    """A worker's log file, read from a mark on."""

    def __init__(self, path):
        self.path = path
        self.at = 0

    def mark(self):
        self.at = self.path.stat().st_size

    def since(self) -> str:
        return self.path.read_bytes()[self.at:].decode(errors="replace")


def _connections(log: str) -> list[str]:
    """A worker's log by connection (it serves one at a time), from its accept to its close."""
    return [c.split("Client connection closed")[0] for c in log.split("Accepted client connection")[1:]]


def _refusals(log: str) -> list[str]:
    """The connections the worker refused, each checked to have run no command."""
    refused = [c for c in _connections(log) if "refused 127.0.0.1:" in c]
    for c in refused:
        assert "closed before any command ran" in c and not RAN_A_COMMAND.search(c), c
    return refused


@pytest.fixture(scope="module")
def keyed(keys, tmp_path_factory):
    """A worker with key A that logs every command it runs (GGML_RPC_DEBUG)."""
    d = tmp_path_factory.mktemp("keyed")
    with loopback_workers(1, ["--mem", "64M", "--no-cache"], env={"GGML_RPC_DEBUG": "1", rpc.ENV_TIMEOUT: "3"},
                          log_dir=d, key_file=keys[0]) as (w,):
        w.log = WorkerLog(d / "worker0.log")
        yield w


class Recorder:
    """A TCP proxy to `target` that keeps, for each of its clients, the bytes it sent and those it got."""

    def __init__(self, target: str):
        self.target = target
        self.sessions: list[tuple[bytearray, bytearray]] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.sockets: list[socket.socket] = []
        self.threads[0].start()

    def _accept(self):
        host, port = self.target.split(":")
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            self.sockets += [client, upstream]
            sent, got = bytearray(), bytearray()
            self.sessions.append((sent, got))
            for args in ((client, upstream, sent), (upstream, client, got)):
                t = threading.Thread(target=self._pump, args=args, daemon=True)
                self.threads.append(t)
                t.start()

    @staticmethod
    def _pump(src, dst, rec):
        try:
            while data := src.recv(1 << 20):
                rec += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.server.close()
        for t in self.threads[1:]:
            t.join(HANG_GUARD)
        for s in self.sockets:
            s.close()


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    """A client's bytes as llama.cpp's requests: | cmd (1) | size (8) | body |."""
    out, i = [], 0
    while i + 9 <= len(data):
        cmd, (n,) = data[i], struct.unpack_from("<Q", data, i + 1)
        out.append((cmd, bytes(data[i + 9:i + 9 + n])))
        i += 9 + n
    return out


def _frame(cmd: int, body: bytes, size: int | None = None) -> bytes:
    return struct.pack("<BQ", cmd, len(body) if size is None else size) + body


def _finish(s: socket.socket, data: bytes, endpoint: str) -> bytes:
    """Send `data` on `s`, end our side, and read until the worker closes: what it answered. Fails
    if the worker neither answers nor closes within HANG_GUARD."""
    got = bytearray()
    s.settimeout(HANG_GUARD)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except socket.timeout:
        pytest.fail(f"worker {endpoint} stopped reading for {HANG_GUARD} s without closing")
    except OSError:
        pass  # closed before it read everything
    try:
        while chunk := s.recv(1 << 20):
            got += chunk
    except socket.timeout:
        pytest.fail(f"worker {endpoint} neither answered nor closed within {HANG_GUARD} s")
    except ConnectionResetError:
        pass
    return bytes(got)


def _talk(endpoint: str, data: bytes) -> bytes:
    """_finish on a new connection."""
    host, port = endpoint.split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as s:
        return _finish(s, data, endpoint)


def _record(model: str, endpoint: str, **kw) -> tuple[np.ndarray, bytes, bytes]:
    """A model's logits computed over `endpoint` through a recording proxy, and the engine's
    session (the largest: the probes before it only say hello): what it sent, what it got."""
    proxy = Recorder(endpoint)
    try:
        logits, _ = _logits(model, rpc_servers=proxy.endpoint, **kw)
    finally:
        proxy.close()
    sent, got = max(proxy.sessions, key=lambda s: len(s[0]))
    return logits, bytes(sent), bytes(got)


# ---- the primitives ----

def _engine_rpc():
    import llama_cpp  # noqa: F401  (loads our libggml, which loads the RPC backend)
    return rpc._lib("libggml-rpc.so")


def test_sha256_and_hmac_match_fips_180_2_and_rfc_4231():
    lib = _engine_rpc()
    out = ctypes.create_string_buffer(32)

    def sha(m):
        lib.ggml_dsc_rpc_sha256(m, ctypes.c_size_t(len(m)), out)
        return out.raw.hex()

    def mac(k, m):
        lib.ggml_dsc_rpc_hmac_sha256(k, ctypes.c_size_t(len(k)), m, ctypes.c_size_t(len(m)), out)
        return out.raw.hex()

    assert sha(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") == \
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    assert sha(b"a" * 1_000_000) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    assert sha(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    rfc4231 = [  # test cases 1-4, 6, 7 (5 is truncated output)
        (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
        (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
        (b"\xaa" * 20, b"\xdd" * 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
        (bytes(range(1, 26)), b"\xcd" * 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
        (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
        (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger than block-size data. "
                        b"The key needs to be hashed before being used by the HMAC algorithm.",
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
    ]
    for key, msg, want in rfc4231:
        assert mac(key, msg) == want
    rnd = random.Random(4231)  # every length around the 64-byte block and padding edges
    for n in list(range(0, 130)) + [1000, 4097]:
        m, k = rnd.randbytes(n), rnd.randbytes(rnd.choice([0, 1, 32, 63, 64, 65, 200]))
        assert sha(m) == hashlib.sha256(m).hexdigest()
        assert mac(k, m) == hmac.new(k, m, hashlib.sha256).hexdigest()


def test_key_files_are_read_alike_here_and_by_the_engine(tmp_path):
    """The rules of serve's API key file (private, not empty), one key of 16+ printable ASCII
    characters; the worker and llama-server read the file themselves, with the same result."""
    lib = _engine_rpc()
    key16 = "abcdefghijklmnop"
    cases = [  # (content, mode, the key or a piece of the refusal)
        (f"{key16}\n", 0o600, key16),
        (f"  # a comment\n\n\t{key16} x  \r\n", 0o400, key16 + " x"),
        ("", 0o600, "holds no key"),
        ("# nothing but a comment\n\n", 0o600, "holds no key"),
        (f"{key16}\n{key16}2\n", 0o600, "holds 2 keys"),
        ("short-key\n", 0o600, "shorter than 16"),
        (f"{key16}\x01\n", 0o600, "not printable"),
        ("ключключключключ\n", 0o600, "not printable"),
        (f"{key16}\n", 0o644, "accessible by others"),
        (f"{key16}\n" + "#" * 5000, 0o600, "larger than"),
    ]
    for i, (text, mode, want) in enumerate(cases):
        path = _key_file(tmp_path / f"k{i}", text, mode)
        key, err = ctypes.create_string_buffer(4200), ctypes.create_string_buffer(512)
        n = lib.ggml_dsc_rpc_read_key_file(str(path).encode(), key, 4200, err, 512)
        try:
            py, py_err = rpc_auth.read_key_file(path), ""
        except rpc.RpcError as e:
            py, py_err = None, str(e)
        if want.startswith(key16):
            assert py == want.encode() and n == len(want) and key.value == want.encode(), (text, err.value)
        else:
            assert py is None and n == -1, (text, py)
            assert want in py_err and want in err.value.decode(), (py_err, err.value)
    for missing in (tmp_path / "none", tmp_path):
        with pytest.raises(rpc.RpcError, match="not found|is a directory"):
            rpc_auth.read_key_file(missing)
    assert rpc_auth.check_key(f" {key16}\n") == key16.encode()
    with pytest.raises(rpc.RpcError, match="not both"):
        rpc_auth.resolve("x" * 16, tmp_path / "k0")


# ---- a worker with a key ----

def test_the_right_key_gives_the_logits_of_one_process(f32_model, reference, keys, keyed, monkeypatch):
    keyed.log.mark()
    got, split = _logits(f32_model, rpc_servers=keyed.endpoint, rpc_key_file=keys[0])
    assert split.workers[0].units
    np.testing.assert_array_equal(got, reference)
    assert "proved the key" in keyed.log.since()
    # as llama-server: the engine reads DEEPSEEK_CPU_RPC_KEY_FILE itself
    monkeypatch.setenv(rpc_auth.ENV_KEY_FILE, str(keys[0]))
    got, _ = _logits(f32_model, rpc_servers=keyed.endpoint)
    np.testing.assert_array_equal(got, reference)
    monkeypatch.delenv(rpc_auth.ENV_KEY_FILE)
    # the key as a string
    assert rpc.probe(keyed.endpoint, key=rpc_auth.check_key(keys[0].read_text().splitlines()[1])).free == 64 << 20


def test_wrong_or_missing_keys_are_one_line_errors_naming_the_worker(f32_model, keys, keyed):
    from deepseek_cpu import Llama
    ep = keyed.endpoint
    keyed.log.mark()
    started = time.monotonic()
    for kw, says in (({"rpc_key_file": keys[1]}, "does not know this client's key"),
                     ({}, "requires a key"),
                     ({"rpc_key": "another key of 16+ characters"}, "does not know this client's key")):
        with pytest.raises(rpc.RpcError, match=says) as e:
            Llama(f32_model, n_ctx=64, verbose=False, rpc_servers=ep, **kw)
        assert ep in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - started < HANG_GUARD
    rpc.probe(ep, key=rpc_auth.read_key_file(keys[0]))  # served once the worker is done with those: all logged
    refused = "".join(_refusals(keyed.log.since()))
    assert refused.count("it sent command 14 first") == 1  # the keyless client's HELLO
    assert refused.count("after the worker's challenge") == 2  # clients that found the worker's proof wrong left
    # a worker without a key, and a client with one
    with loopback_workers(1, ["--mem", "64M", "--no-cache"]) as (plain,):
        with pytest.raises(rpc.RpcError, match=f"worker {plain.endpoint} has no key"):
            Llama(f32_model, n_ctx=64, verbose=False, rpc_servers=plain.endpoint, rpc_key_file=keys[0])
        assert rpc.probe(plain.endpoint, key=None).free == 64 << 20  # still serving


def test_serve_proves_the_key_and_hands_llama_server_its_file(f32_model, keys, keyed):
    from click.testing import CliRunner
    from deepseek_cpu.cli import cli
    r = CliRunner().invoke(cli, ["serve", f32_model, "--rpc", keyed.endpoint, "--rpc-key-file", str(keys[0]), "--dry-run"])
    assert r.exit_code == 0, r.output
    line = r.output.strip().splitlines()[-1]
    assert f"{rpc_auth.ENV_KEY_FILE}={keys[0].resolve()}" in line and keys[0].read_text().split()[-1] not in r.output
    r = CliRunner().invoke(cli, ["serve", f32_model, "--rpc", keyed.endpoint, "--dry-run"])
    assert r.exit_code != 0 and "requires a key" in r.output
    r = CliRunner().invoke(cli, ["serve", f32_model, "--rpc-key-file", str(keys[0]), "--dry-run"])
    assert r.exit_code != 0 and "goes with --rpc" in r.output


def test_a_replayed_session_is_refused_before_any_command(f32_model, reference, keys, keyed):
    """A client's bytes recorded by a proxy (its proof over that session's nonces, then the model's
    buffers, weights and graphs), sent again: the worker's new challenge makes the old proof wrong."""
    keyed.log.mark()
    logits, session, _ = _record(f32_model, keyed.endpoint, rpc_key_file=keys[0])
    np.testing.assert_array_equal(logits, reference)
    recorded = keyed.log.since()
    msgs = _messages(session)
    assert [m[0] for m in msgs[:3]] == [rpc_auth.CMD_AUTH, rpc_auth.CMD_AUTH, rpc.CMD_HELLO]
    assert "[alloc_buffer]" in recorded and "[graph_compute]" in recorded  # the log would show commands
    keyed.log.mark()
    answer = _talk(keyed.endpoint, session)
    # a fresh challenge, then closed (a reset, with the session's bytes unread, may discard the challenge)
    assert answer == b"" or (len(answer) == 8 + 72 and answer[8:16] == rpc_auth.MAGIC_AUTH)
    refused = _refusals(keyed.log.since())
    assert len(refused) == 1 and "a wrong key proof" in refused[0]


def test_an_old_protocol_client_is_closed_before_any_command(keyed):
    keyed.log.mark()
    hello = _frame(rpc.CMD_HELLO, bytes(rpc.CONN_CAPS_SIZE))
    alloc = _frame(0, struct.pack("<IQ", 0, 1 << 20))  # ALLOC_BUFFER
    assert _talk(keyed.endpoint, hello) == struct.pack("<Q", 8) + rpc_auth.MAGIC_NEED_KEY
    # with commands right behind the HELLO: unread when the worker closes, they reset the connection
    assert _talk(keyed.endpoint, hello + alloc + _frame(15, b"")) in (b"", struct.pack("<Q", 8) + rpc_auth.MAGIC_NEED_KEY)
    # a handshake that starts right and then sends a command instead of its proof
    answer = _talk(keyed.endpoint, _frame(rpc_auth.CMD_AUTH, rpc_auth.MAGIC_AUTH + bytes(32)) + hello + alloc)
    assert len(answer) in (0, 8 + 72)
    answer = _talk(keyed.endpoint, _frame(rpc_auth.CMD_AUTH, b"DSCAUTH1 but too short") + alloc)
    assert answer == b""
    refused = _refusals(keyed.log.since())
    assert len(refused) == 4 and "a malformed key handshake" in refused[3]
    assert all("it sent command 14 first" in r for r in refused[:2]) and "after the worker's challenge" in refused[2]
    with pytest.raises(rpc.RpcError, match="requires a key"):
        rpc.probe(keyed.endpoint, key=None)


def test_a_worker_without_a_key_stays_on_loopback_unless_insecure(keys, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from deepseek_cpu.cli import cli
    monkeypatch.delenv(rpc_auth.ENV_KEY_FILE, raising=False)
    run = lambda *a: CliRunner().invoke(cli, ["rpc-worker", "--dry-run", "--no-cache", *a])  # noqa: E731
    r = run("--host", "0.0.0.0")
    assert r.exit_code != 0 and "without a key" in r.output and "--insecure" in r.output
    r = run("--host", "10.1.2.3", "--insecure")
    assert r.exit_code == 0 and "-H 10.1.2.3" in r.output and f"{rpc_auth.ENV_KEY_FILE}= " in r.output
    r = run("--host", "0.0.0.0", "--key-file", str(keys[0]))
    assert r.exit_code == 0 and f"{rpc_auth.ENV_KEY_FILE}={keys[0].resolve()} " in r.output
    monkeypatch.setenv(rpc_auth.ENV_KEY_FILE, str(keys[1]))
    r = run("--host", "0.0.0.0")
    assert r.exit_code == 0 and f"{rpc_auth.ENV_KEY_FILE}={keys[1].resolve()} " in r.output
    r = run("--host", "0.0.0.0", "--key-file", str(_key_file(tmp_path / "open.key", "x" * 32, 0o644)))
    assert r.exit_code != 0 and "chmod 600" in r.output
    assert run().exit_code == 0  # loopback, no key: as before


# ---- a short fuzz of a worker's command parser ----

INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 32, 1 << 40, 1 << 63, (1 << 64) - 1]
# the commands the worker answers (| size | body |); the others it only runs
ANSWERED = {0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15}  # ALLOC_BUFFER ... GET_DEVICE_MEMORY, HELLO, DEVICE_COUNT
ALLOC_BUFFER, BUFFER_GET_BASE, SET_TENSOR, GRAPH_COMPUTE = 0, 3, 6, 10
RPC_TENSOR = 296  # sizeof(rpc_tensor), packed: its buffer handle at byte 12, its address at 220
DESCRIPTOR = RPC_TENSOR + 1 + 8  # a SET_TENSOR's rpc_tensor, cache flag and offset; the weights after them hold no address


class Session:
    """A recorded session: its requests and the worker's answer to each (None: not answered)."""

    def __init__(self, sent: bytes, got: bytes):
        self.requests = _messages(sent)
        self.answers, at = [], 0
        for cmd, _ in self.requests:
            if cmd in ANSWERED:
                (n,) = struct.unpack_from("<Q", got, at)
                self.answers.append(got[at + 8:at + 8 + n])
                at += 8 + n
            else:
                self.answers.append(None)
        self.graph = next(i for i, (c, _) in enumerate(self.requests) if c == GRAPH_COMPUTE)


def _readdress(cmd: int, body: bytes, moved: list[tuple[int, int, int]]) -> bytes:
    """`body` with the recorded session's buffer handles and addresses moved to this session's:
    `moved` holds (old start, size, new start) for each buffer handle and each buffer's memory."""
    n = min(len(body), DESCRIPTOR) if cmd == SET_TENSOR else len(body)
    if not moved or n < 8:
        return body
    out = np.frombuffer(body, np.uint8).copy()
    for shift in range(8):  # an address may sit at any byte offset of a packed request
        m = (n - shift) // 8
        if m <= 0:
            continue
        words = out[shift:shift + 8 * m].view("<u8").copy()
        new = words.copy()
        for old, size, to in moved:
            hit = (words >= old) & (words < old + max(size, 1))
            new[hit] = words[hit] - np.uint64(old) + np.uint64(to)
        if (new != words).any():
            out[shift:shift + 8 * m] = new.view(np.uint8)
    return out.tobytes()


def _live_prefix(s: socket.socket, session: Session, upto: int) -> list[tuple[int, int, int]]:
    """Run the session's requests 0..upto-1 on `s` as the client did, learning where this session's
    buffers are; returns how to move the recorded addresses (see _readdress)."""
    moved, sizes = [], {}
    for (cmd, body), old in zip(session.requests[:upto], session.answers[:upto]):
        s.sendall(_frame(cmd, _readdress(cmd, body, moved)))
        if old is None:
            continue
        (n,) = struct.unpack("<Q", _recv_exact(s, 8))
        new = _recv_exact(s, n)
        if cmd == ALLOC_BUFFER and len(new) == len(old) == 16:
            (was, size), (now, _) = struct.unpack("<QQ", old), struct.unpack("<QQ", new)
            moved.append((was, 1, now))
            sizes[was] = size
        elif cmd == BUFFER_GET_BASE and len(new) == len(old) == 8:
            (handle,) = struct.unpack_from("<Q", body)
            moved.append((struct.unpack("<Q", old)[0], sizes.get(handle, 1), struct.unpack("<Q", new)[0]))
    return moved


def _mutate(rnd: random.Random, cmd: int, body: bytes) -> bytes:
    b = bytearray(body)
    how = rnd.randrange(7)
    if how == 0 and b:  # flip bits
        for _ in range(rnd.randint(1, 8)):
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
    elif how == 1 and len(b) >= 8:  # an interesting value in an aligned field
        width = rnd.choice([4, 8])
        at = rnd.randrange(0, len(b) - width + 1, width)
        b[at:at + width] = (rnd.choice(INTERESTING) & ((1 << 8 * width) - 1)).to_bytes(width, "little")
    elif how == 2:  # cut short, size honest
        del b[rnd.randint(0, len(b)):]
    elif how == 3:  # a size that lies: more than is sent (up to exabytes) or less
        return _frame(cmd, bytes(b), rnd.choice([len(b) + 1, len(b) * 2 + 64, 1 << 30, 1 << 34, 1 << 40, 1 << 62,
                                                  max(0, len(b) - 1)]))
    elif how == 4:  # another command with this body
        cmd = rnd.randrange(20)
    elif how == 5:  # random bytes appended
        b += rnd.randbytes(rnd.randint(1, 64))
    else:  # random bytes spliced in
        at = rnd.randint(0, len(b))
        n = rnd.randint(1, 16)
        b[at:at + n] = rnd.randbytes(n)
    return _frame(cmd, bytes(b))


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _exited(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def test_fuzzing_a_keyless_worker_neither_crashes_nor_hangs_it(f32_model, reference, tmp_path):
    """Random and mutated requests against a keyless loopback worker. Most connections first run a
    recorded session (buffers, weights) up to a point, with its addresses moved to where this
    session's buffers are, so that mutated tensors and graphs get past the buffer checks. Every
    connection is answered or closed within HANG_GUARD, and the worker's memory stays bounded by
    its offer, not by the sizes requests announce. The parser never takes the server down; a graph
    that passes every check of it but whose shapes or data contradict an op can still fail one of
    ggml's own asserts in the CPU kernels (a get_rows index out of range, a product's strides):
    those aborts are counted, and the supervisor's restart is waited for. Any other exit fails."""
    log = WorkerLog(tmp_path / "worker0.log")
    env = {rpc.ENV_TIMEOUT: "2", "GGML_NO_BACKTRACE": "1"}
    with loopback_workers(1, ["--mem", "64M", "--no-cache"], env=env, log_dir=tmp_path) as (w,):
        logits, sent, got = _record(f32_model, w.endpoint)
        np.testing.assert_array_equal(logits, reference)
        session = Session(sent, got)
        host, port = w.endpoint.split(":")
        hello = _frame(*session.requests[0])
        pid = w.server_pid()
        rss0 = peak = _rss_kib(pid)
        # a request that announces 4 GiB and sends 1 MiB costs about 1 MiB, not 4 GiB
        with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as s:
            s.sendall(hello)
            _recv_exact(s, 8 + 4 + rpc.CONN_CAPS_SIZE)
            s.sendall(_frame(SET_TENSOR, bytes(1 << 20), 4 << 30))
            time.sleep(0.5)
            announced = _rss_kib(pid) - rss0
        assert announced < 32 * 1024, f"{announced} KiB for a request of 1 MiB that announced 4 GiB"
        # a graph whose result names no buffer of this client but keeps an address: refused
        # (llama.cpp's create_node; the kernels would write there, wherever it is)
        cmd, graph = session.requests[session.graph]
        n_nodes = struct.unpack_from("<I", graph, 4)[0]
        last = struct.unpack_from("<Q", graph, 8 + 8 * (n_nodes - 1))[0]
        log.mark()
        with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as s:
            moved = _live_prefix(s, session, session.graph)
            g = bytearray(_readdress(cmd, graph, moved))
            at = 8 + 8 * n_nodes + 4
            while struct.unpack_from("<Q", g, at)[0] != last:
                at += RPC_TENSOR
            assert struct.unpack_from("<Q", g, at + 220)[0] != 0
            g[at + 12:at + 20] = bytes(8)
            _finish(s, _frame(cmd, bytes(g)), w.endpoint)
        assert "failed to create graph node" in log.since() and not _exited(pid)
        rnd = random.Random(50)
        sent_n = replayed = conns = deep = 0  # requests fuzzed (random, mutated or after a prefix), and replayed
        kernel_asserts: list[str] = []
        started = time.monotonic()

        def restarted(pid: int) -> int:
            """The server `pid` exited: check why, wait for its successor, return that one's pid."""
            deadline = time.monotonic() + HANG_GUARD
            while not _exited(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            wait_ready(w.endpoint, w.proc, timeout=HANG_GUARD * 3)  # the supervisor restarts it
            why = log.since()
            found = re.findall(r"/ggml/src/ggml-cpu/\S+: GGML_ASSERT\(.*\) failed", why)
            assert found and "(signal 6)" in why, f"the server exited outside a kernel's assert:\n{why[-3000:]}"
            kernel_asserts.append(found[0].split("/ggml-cpu/")[1])
            log.mark()
            return w.server_pid()

        while sent_n < FUZZ_MESSAGES and time.monotonic() - started < FUZZ_SECONDS:
            kind = rnd.random()
            try:
                s = socket.create_connection((host, int(port)), timeout=HANG_GUARD)
            except ConnectionRefusedError:  # the last connection's graph ended the server as it closed
                pid = restarted(pid)
                continue
            with s:
                if kind < 0.6:  # the session up to a point (often its graph), then mutated requests
                    upto = rnd.randint(session.graph - 4, session.graph) if rnd.random() < 0.6 else \
                        rnd.randint(1, len(session.requests) - 1)
                    try:
                        moved = _live_prefix(s, session, upto)
                    except OSError as e:
                        # the last connection's graph may end the server just after this one was
                        # accepted (its kernel assert comes as that connection closes): a reset
                        # then, not a failure of the session
                        deadline = time.monotonic() + HANG_GUARD
                        while not _exited(pid) and time.monotonic() < deadline:
                            time.sleep(0.05)
                        if not _exited(pid):
                            pytest.fail(f"the worker failed a session it served before, at request {upto}: {e}")
                        pid = restarted(pid)
                        continue
                    deep += 1
                    replayed += upto
                    window = session.requests[upto:upto + rnd.randint(1, 6)]
                    bad = {rnd.randrange(len(window)) for _ in range(rnd.randint(1, 2))}
                    out = [_mutate(rnd, c, _readdress(c, b, moved)) if i in bad else _frame(c, _readdress(c, b, moved))
                           for i, (c, b) in enumerate(window)]
                elif kind < 0.85:  # mutated requests of the session, out of order
                    out = [hello] + [_mutate(rnd, *rnd.choice(session.requests)) for _ in range(rnd.randint(1, 6))]
                elif kind < 0.95:  # random requests
                    out = [hello] + [_frame(rnd.randrange(256) if rnd.random() < 0.2 else rnd.randrange(20),
                                            rnd.randbytes(rnd.choice([0, 4, 8, 12, 16, 24, 40, 48, 64, 400, 4000])))
                                     for _ in range(rnd.randint(1, 6))]
                else:  # no handshake: a mutated one, or bytes
                    out = [_mutate(rnd, *session.requests[0]) if rnd.random() < 0.5 else rnd.randbytes(rnd.randint(1, 512))]
                _finish(s, b"".join(out), w.endpoint)
            sent_n += len(out)
            conns += 1
            if _exited(pid):
                pid = restarted(pid)
            else:
                peak = max(peak, _rss_kib(pid))
        elapsed = time.monotonic() - started
        print(f"\nfuzz: {sent_n} requests over {conns} connections ({deep} after a live session prefix of "
              f"{replayed} requests in all) in "
              f"{elapsed:.1f} s; server RSS {rss0 / 1024:.0f} MiB at start, {peak / 1024:.0f} MiB at most "
              f"(+{announced / 1024:.1f} MiB under a 4 GiB announcement); "
              f"{len(kernel_asserts)} graph(s) failed a kernel's assert: {kernel_asserts}")
        assert "Segmentation fault" not in log.path.read_text()
        assert peak < rss0 + 64 * 1024 + 256 * 1024  # the offer (64M) and slack, not what sizes announced
        got, _ = _logits(f32_model, rpc_servers=w.endpoint)  # and it still computes right
        np.testing.assert_array_equal(got, reference)
