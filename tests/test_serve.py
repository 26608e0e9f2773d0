"""`deepseek-cpu serve`: llama-server with our defaults, driven by the real `openai` client.

The server runs on 127.0.0.1 on a free port with a tiny DeepSeek-V2 GGUF; 4 slots.
"""
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from served import CTX, PARALLEL, Served, _env, free_port, post  # noqa: F401

MODEL = "v2_greedy"  # no EOS within the first tokens of these prompts; see _greedy


@pytest.fixture(scope="module")
def gguf(converted):
    return converted(MODEL, "f32")


@pytest.fixture(scope="module")
def server(gguf, tmp_path_factory):
    s = Served(gguf, tmp_path_factory.mktemp("serve") / "server.log")
    yield s
    s.stop()


def test_dry_run_shows_our_defaults(gguf):
    r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(gguf), "--parallel", "3", "--ctx", "512",
                        "--dry-run", "--", "--context-shift"], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    args = r.stdout.split()
    assert args[0].endswith("llama-server")
    for flag in ("--cont-batching", "--metrics", "--jinja"):
        assert flag in args
    assert args[args.index("--parallel") + 1] == "3" and args[args.index("-c") + 1] == str(3 * 512)
    assert args[-1] == "--context-shift"
    from deepseek_cpu.runtime.resources import default_threads
    r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(gguf), "--dry-run"], env=_env(),
                       capture_output=True, text=True, timeout=60)
    args = r.stdout.split()
    assert args[args.index("-t") + 1] == str(default_threads())


def test_prompt_cache_fits_the_memory_left(gguf, monkeypatch):
    """llama-server's prompt cache (--cache-ram, its default 8 GiB whatever the machine has) gets a
    quarter of the memory beside the weights and the slots' KV cache; under a budget, of the
    budget's; a --cache-ram after `--` is the user's and stays the only one."""
    from deepseek_cpu.runtime import model_file, resources, serve
    shape = model_file.read_shape(str(gguf))
    kv = shape.kv_bytes_per_token * 1024
    monkeypatch.setattr(resources, "available_memory", lambda: shape.file_size + kv + (400 << 20))
    args = serve.build_command(str(gguf), ctx_per_slot=512, parallel=2)
    assert args[args.index("--cache-ram") + 1] == "100"
    monkeypatch.setattr(resources, "available_memory", lambda: 1 << 40)
    args = serve.build_command(str(gguf), ctx_per_slot=512, parallel=2)
    assert args[args.index("--cache-ram") + 1] == "8192"  # never above llama-server's own default
    monkeypatch.setattr(resources, "available_memory", lambda: shape.file_size // 2)
    args = serve.build_command(str(gguf), ctx_per_slot=512, parallel=2)
    assert args[args.index("--cache-ram") + 1] == "0"  # nothing to spare: no prompt cache
    args = serve.build_command(str(gguf), ctx_per_slot=512, parallel=2, extra=("--cache-ram", "64"))
    assert args.count("--cache-ram") == 1 and args[args.index("--cache-ram") + 1] == "64"
    r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(gguf), "--mem-budget", "1G", "--ctx", "256",
                        "--parallel", "1", "--dry-run"], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    from deepseek_cpu.runtime import memory_budget
    hot, _ = memory_budget.tensor_bytes(str(gguf))
    expect = model_file.prompt_cache_bytes(shape, 256, available=1 << 30, weights=hot) >> 20
    args = r.stdout.split()
    assert args[args.index("--cache-ram") + 1] == str(expect) and expect > 0


def test_the_parent_reads_the_header_once_and_never_loads_the_engine(gguf):
    """`serve` sizes the slots' context, plans a memory budget and reads ahead from one reading of
    the GGUF's header, and runs llama-server without loading libllama into its own process."""
    code = ("import sys\n"
            "from deepseek_cpu import gguf_header\n"
            "reads, parse = [], gguf_header._parse\n"
            "gguf_header._parse = lambda *a: reads.append(a[0]) or parse(*a)\n"
            "from deepseek_cpu.cli import cli\n"
            "from deepseek_cpu.runtime import serve\n"
            "serve.run_server = lambda *a, **k: 0  # everything up to starting the server\n"
            "try:\n"
            f"    cli.main(['serve', {str(gguf)!r}, '--mem-budget', '4G'], standalone_mode=False)\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(len(reads), sorted(m for m in sys.modules if m.split('.')[0] == 'llama_cpp'\n"
            "                         or m == 'deepseek_cpu.runtime.llama'))\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["1", "[]"], r.stdout


def test_health_and_metrics(server):
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        assert r.status == 200 and "llamacpp:" in r.read().decode()
    models = server.client().models.list()
    assert any(m.id == "tiny" for m in models.data)


def test_chat_and_streaming(server):
    c = server.client()
    msgs = [{"role": "user", "content": "the cat sat"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 16
    assert isinstance(text, str) and len(text) > 0
    parts, finish = [], None
    for ch in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0, stream=True):
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert "".join(parts) == text and finish == r.choices[0].finish_reason


def _greedy(client, prompt, max_tokens=24, **kw):
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage


def test_max_tokens_and_stop(server):
    c = server.client()
    for n in (1, 5, 24):
        text, finish, usage = _greedy(c, "the cat sat", max_tokens=n)
        assert usage.completion_tokens <= n
        if finish == "length":
            assert usage.completion_tokens == n
    full, finish, _ = _greedy(c, "the cat sat", max_tokens=24)
    assert finish == "length", full
    import re
    words = [m for m in re.finditer(r"[a-z]{3,}", full) if m.start() > 0]  # the tiny model also emits raw bytes
    assert words, full
    stop = words[0].group()
    text, finish, _ = _greedy(c, "the cat sat", max_tokens=24, stop=[stop])
    assert finish == "stop"
    assert text == full[: full.index(stop)]
    assert stop not in text


PROMPTS = ["the cat sat", "a dog ran over", "in the beginning", "once upon a time", "the model", "hello world",
           "one two three", "it was the best"]


def test_concurrent_clients_all_answered_none_mixed(server):
    c = server.client()
    alone = {p: _greedy(c, p, max_tokens=32)[0] for p in PROMPTS}
    assert len(set(alone.values())) == len(PROMPTS)  # distinct answers, so a mix-up would show
    got, errors = {}, []

    def ask(p):
        try:
            got[p] = _greedy(server.client(), p, max_tokens=32)[0]
        except Exception as e:  # noqa: BLE001
            errors.append((p, repr(e)))

    threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS]  # 8 requests on 4 slots
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    assert set(got) == set(PROMPTS)
    for p in PROMPTS:
        assert got[p] == alone[p], p


@pytest.mark.parametrize("body,ctype", [
    (b"{not json", "application/json"),
    (b"{}", "application/json"),
    (b'{"messages": "hello"}', "application/json"),
    (b'{"messages": [{"role": "user"}]}', "application/json"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}', "application/json"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "application/json"),
    (b'[1, 2, 3]', "application/json"),
    (b'{"messages": [{"content": "hi"}]}', "application/json"),
    (b'{"messages": [{"role": 5, "content": "hi"}]}', "application/json"),
])
def test_malformed_chat_requests_get_4xx_with_message(server, body, ctype):
    status, text = post(server.url + "/v1/chat/completions", body, ctype)
    assert 400 <= status < 500, (status, text)
    err = json.loads(text)["error"]
    assert err.get("message"), text


@pytest.mark.parametrize("role", ["wizard", "User", ""])
def test_unknown_role_is_a_400_naming_the_field(server, role):
    """A role no chat template knows was skipped by the template and answered 200; now the
    request is refused with the field named, and the server goes on serving."""
    import openai
    c = server.client()
    messages = [{"role": "system", "content": "be brief"}, {"role": role, "content": "the cat sat"}]
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
    assert ei.value.status_code == 400
    assert "messages[1].role" in str(ei.value) and "user" in str(ei.value), str(ei.value)
    messages[1]["role"] = "user"  # still serving
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1


@pytest.mark.parametrize("body", [b"{}", b'{"prompt": 5}', b'{"prompt": "x", "n_predict": "y"}'])
def test_malformed_completion_requests_get_4xx(server, body):
    status, text = post(server.url + "/v1/completions", body)
    assert 400 <= status < 500, (status, text)
    assert json.loads(text)["error"].get("message"), text


def test_prompt_beyond_context_is_a_clear_400(server):
    import openai
    c = server.client()
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the cat sat " * 200}],
                                  max_tokens=8)
    assert ei.value.status_code == 400
    assert "context" in str(ei.value).lower()
    assert _greedy(c, "the cat sat", max_tokens=4)[1] in ("stop", "length")  # still serving


def test_generation_reaching_the_slot_context_ends_cleanly(server):
    """A slot that fills its context stops with finish_reason "length"; the server lives on."""
    c = server.client()
    text, finish, usage = _greedy(c, "the cat sat", max_tokens=600, logit_bias={"399": -100})
    assert finish == "length" and usage.prompt_tokens + usage.completion_tokens <= CTX
    assert _greedy(c, "the cat sat", max_tokens=4)[1] in ("stop", "length")


def test_context_shift_on_deepseek2_does_not_abort(gguf, tmp_path):
    """llama.cpp #8862/#10380: K-shift aborted the server for deepseek2. With --context-shift a
    slot that fills its context shifts and keeps generating past it."""
    s = Served(gguf, tmp_path / "server.log", "--", "--context-shift", parallel=2, ctx=128)
    try:
        text, finish, usage = _greedy(s.client(), "the cat sat", max_tokens=300, logit_bias={"399": -100})
        assert s.proc.poll() is None, s.log.read_text()[-3000:]
        assert usage.completion_tokens > 128 and finish == "length", (usage, finish)
        with urllib.request.urlopen(s.url + "/health", timeout=10) as r:
            assert r.status == 200
    finally:
        assert s.stop() == 0, s.log.read_text()[-3000:]


def wait_for(condition, timeout: float = 60) -> bool:
    """Poll `condition` until it holds; False if it still does not after `timeout` s. The
    timeout only stops a hang: it is no bound on how fast anything must be."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def exited(pid: int) -> bool:
    """The process is gone, or has exited and waits for its parent to reap it (a zombie)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return True


def test_sigterm_shuts_down_cleanly_without_orphans(gguf, tmp_path):
    s = Served(gguf, tmp_path / "server.log")
    kids = s.children()
    assert kids, "serve should run llama-server as a child process"
    assert _greedy(s.client(), "the cat sat", max_tokens=4)[1] in ("stop", "length")
    rc = s.stop(signal.SIGTERM, timeout=60)
    assert rc == 0, s.log.read_text()[-3000:]
    assert wait_for(lambda: all(map(exited, kids))), [k for k in kids if not exited(k)]


def test_parent_killed_takes_the_server_along(gguf, tmp_path):
    s = Served(gguf, tmp_path / "server.log")
    kids = s.children()
    s.proc.kill()
    s.proc.wait()
    assert wait_for(lambda: all(map(exited, kids))), [k for k in kids if not exited(k)]


LLAMA_CPP_SERVER = r"""
import sys, threading, time, json, urllib.request
import uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import ServerSettings, ModelSettings
app = create_app(server_settings=ServerSettings(host="127.0.0.1", port={port}),
                 model_settings=[ModelSettings(model={model!r}, n_ctx=256, n_threads=2, verbose=False)])
srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port={port}, log_level="warning"))
t = threading.Thread(target=srv.run, daemon=True); t.start()
deadline = time.monotonic() + 60  # waits for start-up; no bound on how fast it is
while not srv.started:
    if time.monotonic() > deadline or not t.is_alive(): sys.exit("uvicorn did not start")
    time.sleep(0.05)
req = urllib.request.Request("http://127.0.0.1:{port}/v1/chat/completions", method="POST",
      headers={{"Content-Type": "application/json"}},
      data=json.dumps({{"messages": [{{"role": "user", "content": "the cat sat"}}], "max_tokens": 8, "temperature": 0}}).encode())
print(json.dumps(json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]))
srv.should_exit = True; t.join(30)
"""


def test_llama_cpp_server_still_works(gguf):
    pytest.importorskip("fastapi")
    pytest.importorskip("sse_starlette")
    pytest.importorskip("starlette_context")
    code = LLAMA_CPP_SERVER.format(port=free_port(), model=str(gguf))
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    choice = json.loads(r.stdout.strip().splitlines()[-1])
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
