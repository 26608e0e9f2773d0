"""`deepseek-cpu serve` with an API key: 401 without it, the real `openai` client with it; the key
never on a command line or in the server's environment; key files checked as ssh checks a private
key; a non-loopback address without a key refused before anything starts."""
import json
import os
import time
import subprocess
import sys
from pathlib import Path

import pytest

from served import Served, _env, post

MODEL = "v2_greedy"
KEY = "sk-test-0123456789abcdef"


@pytest.fixture(scope="module")
def gguf(converted):
    return converted(MODEL, "f32")


def key_file(path: Path, text: str, mode=0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def keyed(gguf, tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-auth")
    # a CRLF file with a comment and a second key: both keys work, the '\r' is not part of either
    kf = key_file(d / "keys", f"# the team's keys\r\n{KEY}\r\n\r\nsk-second\r\n")
    s = Served(gguf, d / "server.log", "--api-key-file", str(kf))
    yield s
    s.stop()


def serve(gguf, *args, env_extra=None, timeout=60) -> subprocess.CompletedProcess:
    env = {**_env(), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(gguf), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_requests_without_the_key_are_401(keyed):
    status, text = post(keyed.url + "/v1/chat/completions",
                        json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode())
    assert status == 401, (status, text)
    assert json.loads(text)["error"]["type"] == "authentication_error"
    import openai
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as ei:
        wrong.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ei.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_requests_with_the_key_are_answered(keyed):
    import urllib.request
    with urllib.request.urlopen(keyed.url + "/health", timeout=10) as r:  # public: load balancers probe it
        assert r.status == 200
    import openai
    for key in (KEY, "sk-second"):
        c = openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0, timeout=120)
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the cat sat"}],
                                      max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.completion_tokens >= 1


def test_the_key_is_on_no_command_line_and_in_no_environment(gguf, tmp_path):
    """The key from DEEPSEEK_CPU_API_KEY reaches llama-server through a pipe: not in its
    /proc/PID/cmdline (readable by every user), not in its environment, and no file to leave behind."""
    env_key = "sk-from-the-environment-42"
    os.environ["DEEPSEEK_CPU_API_KEY"] = env_key
    try:
        s = Served(gguf, tmp_path / "server.log")
    finally:
        del os.environ["DEEPSEEK_CPU_API_KEY"]
    try:
        (child,) = s.children()
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        assert b"llama-server" in cmdline and env_key.encode() not in cmdline
        assert b"--api-key-file\0/dev/fd/" in cmdline
        assert env_key.encode() not in Path(f"/proc/{child}/environ").read_bytes()
        status, _ = post(s.url + "/v1/completions", b'{"prompt": "x", "max_tokens": 1}')
        assert status == 401
        import openai
        c = openai.OpenAI(base_url=s.url + "/v1", api_key=env_key, max_retries=0, timeout=120)
        assert c.completions.create(model="tiny", prompt="the cat", max_tokens=2).choices[0].text is not None
        # serve's parent says "ready" when its own /health probe succeeds, which may come after ours
        deadline = time.monotonic() + 120
        while "API key required" not in s.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "API key required" in s.log.read_text()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_key_file_others_may_read_is_refused(gguf, tmp_path, mode):
    kf = key_file(tmp_path / "key", KEY + "\n", mode)
    line = one_line_error(serve(gguf, "--api-key-file", str(kf), "--dry-run"))
    assert f"{mode:04o}" in line and f"chmod 600 {kf}" in line
    assert KEY not in line


@pytest.mark.parametrize("text,says", [("", "holds no key"), ("\n# only a comment\n  \n", "holds no key")])
def test_an_empty_key_file_is_refused(gguf, tmp_path, text, says):
    assert says in one_line_error(serve(gguf, "--api-key-file", str(key_file(tmp_path / "key", text)), "--dry-run"))


def test_a_missing_key_file_is_refused(gguf, tmp_path):
    assert "not found" in one_line_error(serve(gguf, "--api-key-file", str(tmp_path / "nope"), "--dry-run"))


def test_key_options_are_exclusive_and_not_empty(gguf, tmp_path):
    kf = key_file(tmp_path / "key", KEY)
    assert "not both" in one_line_error(serve(gguf, "--api-key", KEY, "--api-key-file", str(kf), "--dry-run"))
    assert "empty" in one_line_error(serve(gguf, "--api-key", " , ", "--dry-run"))


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_network_address_without_a_key_is_refused(gguf, host):
    """Refused before the server starts (no --dry-run here: nothing may be listening)."""
    r = serve(gguf, "--host", host, "--port", "9", env_extra={"DEEPSEEK_CPU_API_KEY": ""})
    line = one_line_error(r)
    assert f"refusing to serve on {host} without an API key" in line and "--insecure" in line


def test_a_network_address_with_a_key_or_insecure_starts_without_cors(gguf, tmp_path):
    """With a key (or --insecure) it would start: on a network address only localhost origins may
    read the API from a browser, unless the user chooses with llama-server's --cors-origins."""
    kf = key_file(tmp_path / "key", KEY)
    for args, env in [(("--api-key-file", str(kf)), None), (("--insecure",), None), ((), {"DEEPSEEK_CPU_API_KEY": KEY})]:
        r = serve(gguf, "--host", "0.0.0.0", *args, "--dry-run", env_extra=env)
        assert r.returncode == 0, r.stderr
        cmd = r.stdout.split()
        assert cmd[cmd.index("--cors-origins") + 1] == "localhost"
        assert KEY not in r.stdout
        assert ("--api-key-file" in cmd) == ("--insecure" not in args)
    r = serve(gguf, "--host", "0.0.0.0", "--insecure", "--dry-run", "--", "--cors-origins", "https://app.example")
    assert r.stdout.split().count("--cors-origins") == 1 and "localhost" not in r.stdout.split()
    r = serve(gguf, "--host", "127.0.0.1", "--dry-run")  # loopback: llama-server's own CORS default
    assert "--cors-origins" not in r.stdout.split() and "--api-key-file" not in r.stdout.split()


def test_loopback_addresses():
    from deepseek_cpu.runtime.serve import is_loopback
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "/run/llama.sock"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.2", "192.168.1.5", "", "no-such-host.invalid"):
        assert not is_loopback(host), host


def test_keys_from_options_file_and_environment(tmp_path):
    from deepseek_cpu.runtime.serve import ServeRefused, api_keys
    assert api_keys("a,b", environ={}) == ["a", "b"]
    assert api_keys(None, key_file(tmp_path / "k", "# c\n x \r\n"), environ={"DEEPSEEK_CPU_API_KEY": "e"}) == ["x"]
    assert api_keys(environ={"DEEPSEEK_CPU_API_KEY": "e"}) == ["e"]
    assert api_keys(environ={"DEEPSEEK_CPU_API_KEY": ""}) == []
    with pytest.raises(ServeRefused, match="directory"):
        api_keys(None, tmp_path, environ={})
