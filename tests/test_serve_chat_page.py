"""The chat page `deepseek-cpu serve` shows at / (plugin/deepseek_cpu/data/chat/index.html, served
by llama-server itself with --path): it loads without the API key while every API call still
needs it, --no-webui leaves the API only, and in a real headless Chromium it streams a reply,
shows DeepSeek's thinking apart from the answer, stops, and never turns model output into markup.

The model is the tiny DeepSeek-V3 fixture carrying DeepSeek-V3.1's chat template (as in
test_agents_current.py), so the thinking switch means something: its random weights never close
a thought, so a thinking reply streams reasoning_content until stopped.

The browser is driven over the DevTools protocol on a pipe (--remote-debugging-pipe), with the
standard library only. `python tests/test_serve_chat_page.py --screenshot docs/images/chat-page.png`
redraws the documentation's screenshot against a scripted stand-in server (the tiny models write
noise).
"""
import base64
import fcntl
import hashlib
import json
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from served import Served, _env, post

from deepseek_cpu.runtime.serve import CHAT_PAGE_DIR, serves_page

PAGE = CHAT_PAGE_DIR / "index.html"
MARKER = '<meta name="application-name" content="deepseek-cpu chat">'
KEY = "sk-chat-page-0123456789"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def script_of(html: str) -> str:
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.S)
    return script


# -- the page's source -----------------------------------------------------------------------

def test_the_page_ships_as_one_file_and_allows_only_its_own_script():
    """One file (llama-server lets only / through without a key), nothing fetched from elsewhere
    (air-gapped sites), and a Content-Security-Policy whose script hash is the page's own script:
    with the hash wrong the browser would refuse to run it."""
    assert sorted(p.name for p in CHAT_PAGE_DIR.iterdir()) == ["index.html"]
    html = PAGE.read_text()
    assert MARKER in html
    script = script_of(html)
    want = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    (got,) = re.findall(r"script-src 'sha256-([^']+)'", html)
    assert got == want, f"the page's script changed: put 'sha256-{want}' in its Content-Security-Policy"
    assert not re.search(r"\b(?:src|href)=\"(?:https?:)?//", html), "the page loads something from another site"
    # what would let text be parsed as markup: the page builds its DOM from text nodes only
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|DOMParser|createContextualFragment|"
                         r"\beval\(|new Function", script)
    # the API through URLs relative to the page (a reverse proxy may serve it under a sub-path)
    assert re.findall(r'fetch\("([^"]+)"', script) == ["v1/models", "v1/chat/completions"]


def test_the_command_line_serves_the_page_unless_no_webui(tmp_path):
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"")  # --dry-run reads no header from it (each step says what it cannot do)

    def dry(*args, env=None):
        r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(gguf), "--ctx", "256", "--dry-run",
                            *args], env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return shlex.split(r.stdout.strip().splitlines()[-1])

    cmd = dry()
    assert cmd[cmd.index("--path") + 1] == str(CHAT_PAGE_DIR) and "--webui" in cmd and "--no-webui" not in cmd
    assert serves_page(cmd, {})
    cmd = dry("--no-webui")
    assert "--no-webui" in cmd and "--path" not in cmd and not serves_page(cmd, {})
    # llama-server's own flags after `--` win: the user's static files, or the UI off
    cmd = dry("--", "--path", "/srv/ui")
    assert cmd.count("--path") == 1 and cmd[cmd.index("--path") + 1] == "/srv/ui" and serves_page(cmd, {})
    assert not serves_page(dry("--", "--no-webui"), {})
    cmd = dry(env={"LLAMA_ARG_STATIC_PATH": "/srv/ui"})
    assert "--path" not in cmd and "--webui" in cmd and serves_page(cmd, {"LLAMA_ARG_STATIC_PATH": "/srv/ui"})


# -- served by llama-server ------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """The tiny V3 fixture with DeepSeek-V3.1's template (hybrid thinking, off by default)."""
    from test_agents_current import _template_text

    from deepseek_cpu.conversion.convert import convert
    from fixture_paths import fixture_dir
    name = "deepseek-ai-DeepSeek-V3.1.jinja"
    text = _template_text("v3.1")  # checked against its recorded source and sha256
    if text is None:
        pytest.skip(f"llama.cpp's models/templates/{name} is not available")
    d = tmp_path_factory.mktemp("chat-page") / "v31"
    shutil.copytree(fixture_dir("v3_noaux"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = text
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    return convert(d, d.parent / "v31.gguf", outtype="f32", progress=False)


@pytest.fixture(scope="module")
def keyed(gguf, tmp_path_factory):
    d = tmp_path_factory.mktemp("chat-page-serve")
    kf = d / "key"
    kf.write_text(KEY + "\n")
    kf.chmod(0o600)
    # greedy by default (the page sends no sampling fields): the same reply on every run
    s = Served(gguf, d / "server.log", "--api-key-file", str(kf), "--", "--temp", "0", parallel=2, ctx=2048)
    yield s
    s.stop()


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def test_the_page_loads_without_the_key_and_the_api_still_needs_it(keyed):
    status, ctype, body = get(keyed.url + "/")
    assert status == 200 and ctype.startswith("text/html"), (status, ctype)
    assert MARKER in body and body == PAGE.read_text()
    chat = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    assert post(keyed.url + "/v1/chat/completions", chat)[0] == 401
    assert get(keyed.url + "/v1/models")[0] == 401
    assert get(keyed.url + "/props")[0] == 401
    # only "/" is open: the page's file under its own name is not (hence one self-contained file)
    assert get(keyed.url + "/index.html")[0] == 401
    assert get(keyed.url + "/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
    # serve's own "ready" line names the page (it comes after serve's own /health probe)
    deadline = time.monotonic() + 60
    while "chat in a browser" not in keyed.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"API key required; chat in a browser: http://127.0.0.1:{keyed.port}/" in keyed.log.read_text()


def test_no_webui_serves_the_api_only(gguf, tmp_path):
    s = Served(gguf, tmp_path / "server.log", "--no-webui", parallel=1, ctx=256)
    try:
        status, _, body = get(s.url + "/")
        assert status == 404 and MARKER not in body, (status, body[:200])
        assert get(s.url + "/v1/models")[0] == 200
        deadline = time.monotonic() + 60
        while "ready on" not in s.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "ready on" in s.log.read_text() and "chat in a browser" not in s.log.read_text()
    finally:
        assert s.stop() == 0


# -- in a real browser -----------------------------------------------------------------------

class Chromium:
    """Headless Chromium over the DevTools protocol on a pipe: with --remote-debugging-pipe it
    reads NUL-terminated JSON commands on fd 3 and writes answers and events on fd 4."""

    def __init__(self, exe: str, profile: Path, log: Path, size=(1000, 720)):
        to_r, self._w = os.pipe()
        self._r, from_w = os.pipe()
        # the child's ends moved above 4 first, so that placing them on 3 and 4 cannot clobber one
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_r, from_w)]
        os.close(to_r)
        os.close(from_w)

        def on_3_and_4():
            os.dup2(ends[0], 3)
            os.dup2(ends[1], 4)

        self.log = log
        self.proc = subprocess.Popen(
            [exe, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}",
             f"--window-size={size[0]},{size[1]}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=open(log, "w"), stderr=subprocess.STDOUT,
            close_fds=False, preexec_fn=on_3_and_4)  # our own fds are close-on-exec; 3 and 4 are not
        for fd in ends:
            os.close(fd)
        self._buf, self._id, self.events = b"", 0, []

    def send(self, method, params=None, session=None, timeout=30.0):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def _read(self, deadline, method):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer {method}")
            if select.select([self._r], [], [], left)[0]:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium exited ({self.proc.poll()}):\n{self.log.read_text()[-2000:]}")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def open(self, url) -> "Tab":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        tab = Tab(self, self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"])
        for domain in ("Runtime", "Log", "Page"):  # script errors, CSP reports
            tab.send(f"{domain}.enable")
        tab.send("Page.navigate", {"url": url})
        tab.wait('document.readyState === "complete" && typeof state === "object"')
        return tab

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


class Tab:
    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def send(self, method, params=None, timeout=30.0):
        return self.browser.send(method, params, self.session, timeout)

    def js(self, expression: str, timeout=30.0):
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        r = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                      timeout)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression: str, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not (value := self.js(expression)):
            if time.monotonic() > deadline:
                status = self.js('document.getElementById("status")?.textContent')
                raise AssertionError(f"timed out waiting for {expression}; the page's status line: {status!r}")
            time.sleep(0.05)
        return value

    def problems(self) -> list[str]:
        """Script errors and Content-Security-Policy refusals the page has had."""
        out = []
        for e in self.browser.events:
            if e.get("sessionId") != self.session:
                continue
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(e["params"]["exceptionDetails"])[:500])
            elif e.get("method") == "Log.entryAdded" and "Content Security Policy" in e["params"]["entry"]["text"]:
                out.append(e["params"]["entry"]["text"])
        return out

    def screenshot(self, path: Path):
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"]))


def chromium_exe() -> str:
    for name in BROWSERS:
        if exe := shutil.which(name):
            return exe
    pytest.skip("not applicable: no Chromium on PATH to run the page in (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = chromium_exe()
    d = tmp_path_factory.mktemp("chromium")
    b = Chromium(exe, d / "profile", d / "chromium.log")
    try:
        b.send("Browser.getVersion", timeout=60)
    except (RuntimeError, TimeoutError) as e:
        b.close()
        pytest.skip(f"not applicable: {exe} does not start headless here: {e}")
    yield b
    b.close()


# the requests with a body the page sends, recorded by wrapping fetch (the page calls the global one)
RECORD = """window.sent = []; const realFetch = window.fetch;
window.fetch = (url, opts) => {
  if (opts?.body) window.sent.push({url, headers: opts.headers, body: JSON.parse(opts.body)});
  return realFetch(url, opts);
}; true"""
# every distinct length `selector`'s text had while the stop button showed, then a click on stop
# once it has shown `renders` different lengths: a reply rendered while it streams, stopped mid-way
GROW_THEN_STOP = """new Promise((resolve, reject) => {
  const seen = new Set(), until = Date.now() + 30000;
  const tick = setInterval(() => {
    const n = document.querySelector(%(selector)s)?.textContent.length || 0;
    if (n && !$("stop").hidden) seen.add(n);
    if (seen.size >= %(renders)d) { clearInterval(tick); $("stop").click(); resolve([...seen]); }
    else if (Date.now() > until || (n && $("stop").hidden)) { clearInterval(tick); resolve([...seen]); }
  }, 5);
})"""


def set_key(tab, key):
    tab.js(f'$("key").value = {json.dumps(key)}; $("key").dispatchEvent(new Event("change")); true')


def send(tab, text, thinking: bool):
    tab.js(f'$("thinking").checked = {json.dumps(thinking)}; $("input").value = {json.dumps(text)}; '
           f'$("send").click(); true')


def test_chat_in_a_browser(browser, keyed):  # browser first: no server for a skip
    tab = browser.open(keyed.url + "/")
    tab.js(RECORD)
    # no key yet: the model's name cannot be read, and the page says where the key goes
    tab.wait('$("model").textContent === "API key needed"')
    assert "needs an API key (401)" in tab.js('$("status").textContent')
    assert tab.js('$("key-details").open')

    # a wrong key: the message is refused and comes back to the input for another try
    set_key(tab, "sk-wrong")
    send(tab, "the cat sat", thinking=False)
    tab.wait('window.sent.length === 1 && $("stop").hidden && $("input").value === "the cat sat"')
    assert "refused this API key (401)" in tab.js('$("status").textContent')
    assert tab.js('document.querySelectorAll(".turn").length') == 0
    assert tab.js('window.sent.at(-1).headers.Authorization') == "Bearer sk-wrong"

    # the key: the model's name appears and the key's panel folds; the key stays out of
    # localStorage unless the user asks
    set_key(tab, KEY)
    tab.wait('$("model").textContent === "tiny"')
    assert not tab.js('$("key-details").open') and tab.js('$("status").textContent') == ""
    assert tab.js('localStorage.getItem("deepseek-cpu.api-key")') is None
    tab.js('$("remember").click(); true')
    assert tab.js('localStorage.getItem("deepseek-cpu.api-key")') == KEY
    tab.js('$("remember").click(); true')
    assert tab.js('localStorage.getItem("deepseek-cpu.api-key")') is None

    # thinking on: the thought streams into its own open, collapsible box; stop ends it mid-way
    send(tab, "Why is the sky blue?", thinking=True)
    grown = tab.js(GROW_THEN_STOP % {"selector": json.dumps(".turn.assistant .thought-text"), "renders": 2}, timeout=60)
    assert len(grown) >= 2, f"the thought was not rendered while it streamed: lengths {grown}"
    tab.wait('$("send").hidden === false && $("stop").hidden === true')
    assert tab.js('document.querySelector(".turn.assistant details.thought").open')
    assert tab.js('document.querySelector(".turn.assistant .answer").textContent') == ""
    assert tab.js('document.querySelector(".turn.assistant .meta").textContent') == "stopped"
    body = tab.js("window.sent.at(-1)")
    assert body["url"] == "v1/chat/completions" and body["headers"]["Authorization"] == f"Bearer {KEY}"
    assert body["body"]["stream"] is True and body["body"]["chat_template_kwargs"] == {"thinking": True}

    # thinking off: the answer streams to its end, with no thought box, and the facts line after it
    send(tab, "Hi!", thinking=False)
    tab.wait('document.querySelectorAll(".turn.assistant .meta").length === 2', timeout=60)
    answer = tab.js('document.querySelectorAll(".turn.assistant")[1].querySelector(".answer").textContent')
    assert answer, "no streamed answer"
    assert tab.js('document.querySelectorAll(".turn.assistant")[1].querySelector(".thought")') is None
    assert re.search(r"\d+ tokens, [\d.]+ tokens/s", tab.js('document.querySelectorAll(".turn.assistant .meta")[1]'
                                                             '.textContent'))
    body = tab.js("window.sent.at(-1)")["body"]
    assert body["chat_template_kwargs"] == {"thinking": False}
    # the conversation goes back to the model: the answers, never the thoughts
    assert [(m["role"], m["content"]) for m in body["messages"]] == [
        ("user", "Why is the sky blue?"), ("assistant", ""), ("user", "Hi!")]
    assert tab.js("state.history.length") == 4 and tab.js("state.history[3].content")

    # new conversation: an empty page and an empty history
    tab.js('$("new").click(); true')
    assert tab.js('document.querySelectorAll(".turn").length') == 0 and tab.js("state.history.length") == 0
    assert tab.problems() == []


def test_model_output_is_shown_as_text_never_as_markup(browser, keyed):
    """What a reply holds goes through the page's small markdown renderer: code fences, `code` and
    **bold** become elements, and everything else (HTML included) stays text."""
    tab = browser.open(keyed.url + "/")
    hostile = ('<img src=x onerror="window.pwned=1"> **bold** and `<b>code</b>`\n\n'
               '```html\n<script>window.pwned=2</script>\n```\n\nlast <iframe src="javascript:window.pwned=3">')
    got = tab.js(f"""(async () => {{
        const r = new Reply();
        r.addContent({json.dumps(hostile)});
        r.finish("");
        await new Promise((ok) => setTimeout(ok, 200));
        const a = r.div.querySelector(".answer");
        return {{elements: [...a.querySelectorAll("*")].map((e) => e.tagName),
                 strong: a.querySelector("strong").textContent,
                 code: [...a.querySelectorAll("code")].map((e) => e.textContent),
                 text: a.textContent, pwned: window.pwned ?? null}};
    }})()""")
    assert got["pwned"] is None
    assert not {"IMG", "SCRIPT", "IFRAME", "B"} & set(got["elements"]), got["elements"]
    assert got["strong"] == "bold" and got["code"] == ["<b>code</b>", "<script>window.pwned=2</script>"]
    assert '<img src=x onerror="window.pwned=1">' in got["text"] and "<iframe" in got["text"]
    # the user's own text too
    tab.js('document.querySelector(".turn")?.remove(); const t = addTurn("user"); '
           't.textContent = "<b>mine</b>"; true')
    assert tab.js('document.querySelector(".turn.user").textContent') == "<b>mine</b>"
    assert tab.js('document.querySelector(".turn.user b")') is None
    assert tab.problems() == []


def test_failures_are_said_plainly(browser, keyed):
    """Each failure is one sentence that says what to do, and the unsent text comes back to the
    input (the answers here are made up in the page: a server that vanished, one that fails, a
    template without a thinking mode)."""
    tab = browser.open(keyed.url + "/")
    set_key(tab, KEY)
    tab.wait('$("model").textContent === "tiny"')

    def answered(fake, thinking=False) -> str:
        tab.js(f"window.fetch = () => {fake}; true")
        send(tab, "question", thinking)
        tab.wait('$("stop").hidden && $("input").value === "question" && $("status").textContent')
        assert tab.js('document.querySelectorAll(".turn").length') == 0 and tab.js("state.history.length") == 0
        assert tab.js('$("status").classList.contains("error")')
        return tab.js('$("status").textContent')

    assert answered('Promise.reject(new TypeError("Failed to fetch"))') == (
        "Cannot reach the server (Failed to fetch). Is deepseek-cpu serve still running?")
    tab.js('$("input").value = ""; true')
    error = 'Promise.resolve(new Response(JSON.stringify({error: {message: %s}}), {status: %d}))'
    assert answered(error % ('"boom"', 500)) == "The server answered 500: boom."
    tab.js('$("input").value = ""; true')
    assert answered(error % ('"Loading model"', 503)) == (
        "The server is not ready yet (503: Loading model). Try again in a moment.")
    tab.js('$("input").value = ""; true')
    # DeepSeek-V2/V2.5/V3 templates: asking for a thought is a 400; the switch turns itself off
    said = answered(error % ('"chat_template_kwargs.thinking: the model\'s chat template has no thinking mode"', 400),
                    thinking=True)
    assert said.startswith("The server answered 400: chat_template_kwargs.thinking")
    assert tab.js('$("thinking").checked') is False and tab.js('$("thinking").disabled') is True
    assert tab.problems() == []


# -- the documentation's screenshot ----------------------------------------------------------

SCRIPTED = [  # (field, text) deltas of the scripted reply
    *[("reasoning_content", w) for w in re.findall(r"\S+\s*", (
        "The user wants a one-liner. Slicing with a step of -1 is the idiomatic way; "
        "reversed() with join also works but is longer."))],
    *[("content", w) for w in re.findall(r"\S+\s*|\n+", (
        "Use a slice with a step of -1:\n\n```python\nreversed_text = text[::-1]\n```\n\n"
        "`[::-1]` walks the string from its end to its start, so **no loop** is needed."))],
]


def scripted_server():
    """A stand-in for llama-server that serves the page and streams SCRIPTED (for the screenshot)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, ctype, data: bytes):
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/":
                self.reply("text/html; charset=utf-8", PAGE.read_bytes())
            else:
                self.reply("application/json", json.dumps({"data": [{"id": "scripted-demo"}]}).encode())

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for field, text in SCRIPTED:
                self.wfile.write(f"data: {json.dumps({'choices': [{'delta': {field: text}}]})}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.04)
            self.wfile.write(b"data: [DONE]\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def screenshot(out: Path):
    import tempfile
    srv = scripted_server()
    with tempfile.TemporaryDirectory() as d:
        b = Chromium(chromium_exe(), Path(d) / "profile", Path(d) / "chromium.log", size=(900, 560))
        try:
            tab = b.open(f"http://127.0.0.1:{srv.server_address[1]}/")
            tab.wait('$("model").textContent === "scripted-demo"')
            send(tab, "Reverse a string in Python, in one line.", thinking=True)
            tab.wait('$("stop").hidden && document.querySelector(".turn.assistant .answer")'
                     '?.textContent.endsWith("needed.")', timeout=60)
            tab.js('document.querySelector("details.thought").open = true; $("input").blur(); true')
            tab.screenshot(out)
        finally:
            b.close()
            srv.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--screenshot"] or len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} --screenshot OUT.png")
    screenshot(Path(sys.argv[2]))
