"""What `deepseek-cpu serve MODEL` runs: llama.cpp's own HTTP server (llama-server), built from the same
patched tree as our libllama, with defaults for serving a team from CPUs.

llama_cpp.server (llama-cpp-python's FastAPI server) answers one request at a time;
llama-server runs N slots with continuous batching: the prompts and next tokens of all
active requests go through the model together, so N clients share one forward pass.

Defaults chosen here (everything else is llama-server's own; append more flags after `--`):
  --parallel 4            slots, i.e. requests decoded concurrently
  -c  parallel * ctx      ctx per slot (--ctx) defaults to the memory-fitting context of
                          deepseek_cpu.Llama divided among the slots, at most 4096, at least 256
  --cont-batching         continuous batching (explicit, in case upstream's default changes)
  --metrics               Prometheus metrics on /metrics
  --jinja                 the GGUF's own chat template (DeepSeek's, as transformers renders it);
                          tool calls and JSON-schema replies for V2.5/V3/R1/V3.1 templates come
                          from our handler in patches/files/common/parsers/ (docs/integrations.md)
  --reasoning off         only for a template whose own default is not to think (DeepSeek-V3.1,
                          V3.2, V4: `thinking` unset means off), so that a request that does not
                          choose gets the model's default; llama-server would pass
                          enable_thinking=true. A request still chooses per call with
                          chat_template_kwargs {"thinking": true} or {"enable_thinking": true}
  --no-reasoning-preserve for a template that drops earlier turns' thoughts (V4's drop_thinking),
                          so that a multi-turn prompt is the one DeepSeek's encoder renders
  -t/-tb                  physical cores of this process (affinity, cgroup quota)
  -fa off                 as deepseek_cpu.Llama: CPU flash attention costs accuracy
  --webui --path DIR      our chat page (data/chat/index.html) at /, served by llama-server itself
                          from DIR: the pinned llama.cpp source carries no built web UI. `/` is the one
                          path llama-server's API-key check lets through, so the page loads without a
                          key and the user enters it there; every API call still needs it. Hence a
                          single self-contained file (anything else under DIR would need the key).
                          Not with the user's own --path (or LLAMA_ARG_STATIC_PATH): theirs is served.
  --no-webui              instead, with serve's --no-webui (webui=False): the API only, / is a 404
  --api-key-file /dev/fd/N  with an API key (--api-key, --api-key-file or DEEPSEEK_CPU_API_KEY):
                          the keys reach llama-server through a pipe, never on its command line
                          (visible in /proc) nor in a file left behind
  --cors-origins localhost  on a non-loopback address: no other web site's page may read the API
                          from a visitor's browser (llama-server's default is every origin)

A non-loopback address without an API key is refused (ServeRefused) unless insecure=True.

llama-server runs with MALLOC_MMAP_THRESHOLD_=4 MiB (unless the environment chooses one): glibc's
moving threshold kept each oversized request body's memory (see allocator_env).

The parent process forwards SIGTERM/SIGINT to the server (exactly once; a second one kills it,
and so does a server still running SHUTDOWN_GRACE_S after the first), waits for
/health before announcing the URL, and exits with the server's status. The server runs
with PR_SET_PDEATHSIG, so it does not outlive a killed parent.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import DeepseekCpuError
from .private_file import read_private_file
from .processes import die_with_parent

DEFAULT_PARALLEL = 4
MAX_CTX_PER_SLOT = 4096
MIN_CTX_PER_SLOT = 256
ENV_SERVER = "DEEPSEEK_CPU_LLAMA_SERVER"  # path of another llama-server binary (tests, dev builds)
ENV_API_KEY = "DEEPSEEK_CPU_API_KEY"  # the API key (comma-separated keys) when no option gives one
# stands for the pipe the keys are read from (/dev/fd/N, made when the server starts)
API_KEY_PIPE = "<api-key-pipe>"
MAX_KEYS_BYTES = 60_000  # the keys are written to a pipe before the server reads them: under its 64 KiB
# glibc malloc's mmap threshold for llama-server (allocator_env): blocks this size and larger are
# mapped for each use and unmapped when freed; the largest per-token buffer of a DeepSeek
# (the sampler's 129,280 candidates, 1.5 MiB) stays below it
MMAP_THRESHOLD = 4 << 20
# seconds llama-server is given to exit after SIGTERM/SIGINT before serve kills it. On the signal
# its loop stops generating and it joins its HTTP threads, but a thread still answering a request
# waits for tokens that no longer come: a stream until its next SSE ping (30 s), a request
# without `stream` until the client gives up (never, for a client without a timeout). Nothing is
# lost by the kill: the replies could not have been finished anyway.
SHUTDOWN_GRACE_S = 10.0
# the chat page's folder (package data; see CHAT_PAGE_DIR's use in build_command)
CHAT_PAGE_DIR = Path(__file__).resolve().parent.parent / "data" / "chat"

log = logging.getLogger(__name__)


class ServerNotFound(DeepseekCpuError):
    """No llama-server binary to run. (A library error, not a click one: the CLI reports
    every DeepseekCpuError as one `Error: ...` line; see cli.py.)"""


def server_binary() -> Path:
    """The llama-server shipped next to our libllama (or $DEEPSEEK_CPU_LLAMA_SERVER)."""
    env = os.environ.get(ENV_SERVER)
    if env:
        return Path(env)
    from .. import _dropin
    from .engine import lib_dir
    # the engine's rule ($LLAMA_CPP_LIB_PATH, our lib/, a source checkout's installed one),
    # asked for the directory that holds llama-server
    found = _dropin.find_lib_dir(name="llama-server")
    if found is not None:
        return Path(found) / "llama-server"
    raise ServerNotFound(
        f"llama-server not found in {lib_dir()}; reinstall deepseek-cpu with DEEPSEEK_CPU_BUILD_SERVER=ON "
        f"(the default) or point {ENV_SERVER} at a llama-server binary")


class ServeRefused(DeepseekCpuError, ValueError):
    """The server would not be safe or could not read its key: an API key file that is missing,
    empty or open to others, or a network address without a key."""


def _keys_of(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def read_api_key_file(path: str | os.PathLike) -> list[str]:
    """The keys in an API key file: one a line, blank lines and '#' comments skipped, spaces
    around a key (a CRLF file's \\r) dropped. Refused, as ssh refuses a private key, when the
    file is a regular one that its group or others may access (llama-server's own --api-key-file
    reads whatever it is given)."""
    data = read_private_file(path, "API key file", ServeRefused, MAX_KEYS_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ServeRefused(f"API key file {path} is not UTF-8 text") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ServeRefused(f"API key file {path} holds no key (one key a line; '#' starts a comment)")
    return keys


def api_keys(key: str | None = None, key_file: str | os.PathLike | None = None,
             environ=os.environ) -> list[str]:
    """The API keys the server is to accept: --api-key (comma-separated, as llama-server's),
    else --api-key-file, else $DEEPSEEK_CPU_API_KEY (empty means unset); [] for none."""
    if key is not None and key_file is not None:
        raise ServeRefused("give --api-key or --api-key-file, not both")
    if key is not None:
        keys = _keys_of(key)
        if not keys:
            raise ServeRefused("--api-key is empty")
    elif key_file is not None:
        keys = read_api_key_file(key_file)
    else:
        keys = _keys_of(environ.get(ENV_API_KEY, ""))
    if any("\n" in k or "\r" in k for k in keys):
        raise ServeRefused("an API key cannot span lines")
    if len("\n".join(keys).encode()) > MAX_KEYS_BYTES:
        raise ServeRefused(f"the API keys take more than {MAX_KEYS_BYTES} bytes")
    return keys


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host`: a loopback address, a name whose every address
    is loopback, or a Unix socket (llama-server takes a host ending in .sock as one)."""
    if host.endswith(".sock"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def _given(flags: tuple[str, ...], extra, env_vars: tuple[str, ...], environ) -> bool:
    """Whether llama-server flags after `--` (or its environment variables) set an option."""
    return (any(a.split("=", 1)[0] in flags for a in extra)
            or any(environ.get(v) for v in env_vars))


def server_has_own_key(extra=(), environ=os.environ) -> bool:
    """llama-server given a key directly: --api-key/--api-key-file after `--`, or its variables."""
    return _given(("--api-key", "--api-key-file"), extra, ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE"), environ)


def check_exposure(host: str, keys: list[str], extra=(), insecure: bool = False, environ=os.environ) -> None:
    """Refuse to serve on an address other machines can reach without an API key."""
    if keys or insecure or server_has_own_key(extra, environ) or is_loopback(host):
        return
    raise ServeRefused(
        f"refusing to serve on {host} without an API key: anyone who reaches the port could use the model; "
        f"give --api-key-file PATH (or --api-key, ${ENV_API_KEY}), or --insecure to serve without one")


def default_ctx_per_slot(model: str, parallel: int, header=None) -> int:
    """Each slot's share of the context that fits memory (model_file.default_n_ctx)."""
    from .model_file import default_n_ctx, read_shape
    shape = read_shape(model, header)
    total = default_n_ctx(shape)
    per = min(MAX_CTX_PER_SLOT, max(MIN_CTX_PER_SLOT, total // max(parallel, 1)))
    if shape is not None:
        per = min(per, shape.n_ctx_train)
    return per


def rpc_ctx_per_slot(model: str, header=None) -> int:
    """With RPC workers the KV cache lives on them: this host's memory does not bound the context."""
    from .model_file import read_shape
    shape = read_shape(model, header)
    return min(MAX_CTX_PER_SLOT, shape.n_ctx_train if shape else MAX_CTX_PER_SLOT)


# llama-server flags that choose the template or the thinking default themselves
_THINKING_FLAGS = ("--reasoning", "-rea", "--chat-template", "--chat-template-file", "--chat-template-kwargs")
_PRESERVE_FLAGS = ("--reasoning-preserve", "--no-reasoning-preserve")


def template_thinks_by_default(template: str | None) -> bool | None:
    """Whether a chat template, rendered for one user turn with no thinking variable set, opens a
    thought the way it does when llama-server passes enable_thinking=true; None when it cannot
    be rendered here or enable_thinking changes nothing (the template has no such switch)."""
    if not template:
        return None
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        tmpl = env.from_string(template)
        ctx = dict(messages=[{"role": "user", "content": "x"}], add_generation_prompt=True,
                   bos_token="", eos_token="", tools=None)
        own, on = tmpl.render(**ctx), tmpl.render(**ctx, enable_thinking=True)
    except Exception:  # a template Python's jinja2 cannot render: leave llama-server's default
        return None
    return None if own == on else False


def build_command(model: str, host: str = "127.0.0.1", port: int = 8080, parallel: int = DEFAULT_PARALLEL,
                  ctx_per_slot: int | None = None, threads: int | None = None, alias: str | None = None,
                  extra: tuple[str, ...] | list[str] = (), header=None, api_key: bool = False,
                  webui: bool = True, mtp: int = 0, prompt_cache: int | None = None) -> list[str]:
    """llama-server's command line; api_key: the keys come through API_KEY_PIPE (run_server
    makes the pipe, given the keys); webui: our chat page at / (else the API only); mtp: draft
    tokens a step with the model's MTP head (0: off); prompt_cache: bytes for llama-server's
    prompt cache (default: model_file.prompt_cache_bytes for this machine's memory)."""
    from .resources import default_threads
    threads = threads or default_threads()
    ctx_per_slot = ctx_per_slot or default_ctx_per_slot(model, parallel, header)
    cmd = [
        str(server_binary()), "-m", str(model),
        "--host", host, "--port", str(port),
        "--parallel", str(parallel), "-c", str(ctx_per_slot * parallel),
        "--cont-batching", "--metrics", "--jinja",
        "-t", str(threads), "-tb", str(threads),
        "-fa", "off",
    ]
    if not _given(("--cache-ram", "-cram"), extra, ("LLAMA_ARG_CACHE_RAM",), os.environ):
        if prompt_cache is None:
            from .model_file import prompt_cache_bytes, read_shape
            prompt_cache = prompt_cache_bytes(read_shape(model, header), ctx_per_slot * parallel)
        cmd += ["--cache-ram", str(prompt_cache >> 20)]
    if not webui:
        cmd += ["--no-webui"]
    elif _given(("--path",), extra, ("LLAMA_ARG_STATIC_PATH",), os.environ):
        cmd += ["--webui"]  # the user's own static files
    else:
        cmd += ["--webui", "--path", str(CHAT_PAGE_DIR)]
    if alias:
        cmd += ["--alias", alias]
    if mtp:  # llama-server's MTP drafting: an MTP context on the same model (docs/mtp.md)
        cmd += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(mtp)]
    if api_key:
        cmd += ["--api-key-file", API_KEY_PIPE]
    if not is_loopback(host) and not _given(("--cors-origins",), extra, ("LLAMA_ARG_CORS_ORIGINS",), os.environ):
        cmd += ["--cors-origins", "localhost"]
    template = header.get("tokenizer.chat_template") if header is not None else None
    if template and not any(a.split("=", 1)[0] in _THINKING_FLAGS for a in extra):
        if template_thinks_by_default(template) is False:
            cmd += ["--reasoning", "off"]
    # DeepSeek-V4's templates drop earlier turns' thoughts (drop_thinking, as DeepSeek's encoder
    # does); llama-server would keep them unless told not to (its reasoning-preserve default)
    if template and "drop_thinking" in template and not any(a in _PRESERVE_FLAGS for a in extra):
        cmd += ["--no-reasoning-preserve"]
    return cmd + list(extra)


def serves_page(cmd: list[str], environ=os.environ) -> bool:
    """Whether llama-server run with `cmd` serves a page at /: static files given (--path, or its
    variable) and the UI not turned off by the last of its on/off flags (a `-- --no-webui` after
    ours wins)."""
    on = True
    for a in cmd:
        if a in ("--ui", "--webui"):
            on = True
        elif a in ("--no-ui", "--no-webui"):
            on = False
    return on and _given(("--path",), cmd, ("LLAMA_ARG_STATIC_PATH",), environ)


def base_url(host: str, port: int) -> str:
    """http://HOST:PORT for a host as given to --host: an IPv6 address in brackets (RFC 3986);
    `http://:::8080/`, as printed for `--host ::` before, is no URL a browser or client takes."""
    bare = host.strip("[]")
    try:
        if ipaddress.ip_address(bare.split("%")[0]).version == 6:
            return f"http://[{bare}]:{port}"
    except ValueError:
        pass
    return f"http://{host}:{port}"


def probe_host(host: str) -> str:
    """Where this process asks a server bound to `host` for /health: loopback for a wildcard bind
    (llama-server's IPv6 socket is dual-stack: cpp-httplib clears IPV6_V6ONLY), else the host."""
    return "127.0.0.1" if host.strip("[]") in ("0.0.0.0", "::", "") else host


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 600.0, stop=None) -> bool:
    """Poll GET url/health until 200 (503 while the model loads). False if the server died, timed
    out, or stop() says to give up (a shutdown asked for while it was still being awaited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (proc is not None and proc.poll() is not None) or (stop is not None and stop()):
            return False
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.1)
    return False


def run_server(cmd: list[str], host: str, port: int, ready_timeout: float = 600.0,
               env_extra: dict[str, str] | None = None, cpus: set[int] | None = None,
               workers: list[str] | None = None, say=log.info, api_keys: list[str] | None = None) -> int:
    """Run llama-server until it exits; with RPC workers, a server that exits because a worker was
    lost is replaced by a 503 answer on the same port until every worker answers again, then
    started again (runtime/rpc_serve.py). `say` takes each line of progress for the user.
    api_keys: written to a pipe that llama-server reads as its --api-key-file (API_KEY_PIPE)."""
    if not workers:
        return _run_once(cmd, host, port, ready_timeout, env_extra, cpus, say, api_keys)
    from . import rpc_serve
    return rpc_serve.run_supervised(lambda: _run_once(cmd, host, port, ready_timeout, env_extra, cpus, say, api_keys),
                                    host, port, workers, say)


def allocator_env(environ=os.environ) -> dict[str, str]:
    """llama-server's environment for glibc malloc: a fixed mmap threshold, unless the user chose one.

    Why: glibc serves a block above its mmap threshold (128 KiB at first) by mmap and unmaps it
    when freed, but then raises the threshold to that block's size (up to 32 MiB) and the trim
    threshold to twice it, so later blocks of that size come from the arena of the thread that
    asks, which keeps them after they are freed. llama-server reads a request body of up to
    100 MiB (cpp-httplib's limit) into a string that grows by doubling, on any of its HTTP threads
    (at least --parallel + 4 of them, each with its own arena up to 8 per core): a few oversized
    bodies left ~330 MB more resident for good on 2 cores (tests/test_serve_soak.py), a 16-fold
    growth of a small model's server, and more on more cores. A fixed threshold turns the raising
    off; the bodies' buffers go back to the system when the request ends."""
    if "MALLOC_MMAP_THRESHOLD_" in environ or "malloc.mmap_threshold" in environ.get("GLIBC_TUNABLES", ""):
        return {}
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}


def _key_pipe(keys: list[str]) -> int:
    """The read end of a pipe holding the keys, one a line (written whole: they fit its buffer)."""
    r, w = os.pipe()
    try:
        os.write(w, ("\n".join(keys) + "\n").encode())
    finally:
        os.close(w)
    return r


def _run_once(cmd: list[str], host: str, port: int, ready_timeout: float = 600.0,
              env_extra: dict[str, str] | None = None, cpus: set[int] | None = None, say=log.info,
              api_keys: list[str] | None = None) -> int:
    env = {**os.environ, **(env_extra or {})}
    env.update(allocator_env(env))
    env.pop(ENV_API_KEY, None)  # the server reads the keys from the pipe; nothing else needs them
    pass_fds: tuple[int, ...] = ()
    if API_KEY_PIPE in cmd:
        if not api_keys:
            raise ValueError("the command reads API keys from a pipe, but no keys were given")
        pass_fds = (_key_pipe(api_keys),)
        cmd = [f"/dev/fd/{pass_fds[0]}" if a == API_KEY_PIPE else a for a in cmd]
    # the libraries the binary was built with lie next to it (libllama, libggml*, libmtmd)
    libs = str(Path(cmd[0]).resolve().parent)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libs, env.get("LD_LIBRARY_PATH", "")) if p)
    # own session: a terminal's Ctrl-C reaches only us, and we forward it once (a second
    # SIGINT makes llama-server exit at once, skipping its clean shutdown)
    def before_exec():
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=before_exec, pass_fds=pass_fds)
    finally:
        for fd in pass_fds:  # the server holds its own copy
            os.close(fd)
    forwarded = []
    asked_at = []  # when the first signal was forwarded (the grace period's start)

    def forward(signum, frame):
        if proc.poll() is None:
            if forwarded:  # asked twice: stop now
                proc.kill()
            else:
                proc.send_signal(signum)
                asked_at.append(time.monotonic())
            forwarded.append(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        url = base_url(probe_host(host), port)
        # a signal before the server answered ends the wait: a server shutting down answers no
        # /health, and waiting out ready_timeout would also hold off the grace period below (seen
        # under load: a client's request reached the server before this poll did)
        if wait_ready(url, proc, ready_timeout, stop=lambda: bool(forwarded)):
            shown = base_url(host, port)
            say(f"ready on {shown}/v1 (OpenAI-compatible; /health, /metrics)"
                + ("; API key required" if pass_fds else "")
                + (f"; chat in a browser: {shown}/" if serves_page(cmd, env) else ""))
        elif proc.poll() is None and not forwarded:
            say(f"{url}/health not ready after {ready_timeout:.0f} s")
        stopped_late = False
        while True:
            try:
                rc = proc.wait(timeout=0.5)  # in steps: the grace period below is counted here
                break
            except subprocess.TimeoutExpired:
                if asked_at and not stopped_late and time.monotonic() - asked_at[0] > SHUTDOWN_GRACE_S:
                    say(f"llama-server still running {SHUTDOWN_GRACE_S:.0f} s after the signal "
                        f"(requests in flight wait for tokens that no longer come): stopped")
                    proc.kill()
                    stopped_late = True
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
                continue
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for s, h in old.items():
            signal.signal(s, h)
    if rc < 0:  # killed by a signal
        if stopped_late and rc == -signal.SIGKILL:  # the shutdown asked for, finished by us
            return 0
        return 0 if forwarded and -rc in forwarded else 128 - rc
    return rc


def budget_env(model, mem_budget, policy, parallel, ctx_per_slot, dry_run, header=None, say=log.info) -> dict[str, str]:
    """Check the budget against the always-hot set and the slots' KV cache, warm the page cache
    with the prefetch policy's placement (unless dry_run), and return llama-server's environment:
    the experts kept in the file mapping, and read ahead as each router chooses them."""
    from . import memory_budget, prefetch
    from .model_file import read_shape
    header = header or memory_budget.read_header(model)
    shape = read_shape(model, header)
    ctx = (ctx_per_slot or default_ctx_per_slot(model, parallel, header)) * parallel
    plan = memory_budget.plan(model, memory_budget.parse_size(mem_budget),
                              (shape.kv_bytes_per_token if shape else 0) * ctx, header)
    if not dry_run:
        layout = prefetch.layout(model, header)
        placement, name = prefetch.plan_policy(policy, layout, plan)
        n = prefetch.advise_file(layout, placement)
        say(f"{plan.describe()}; prefetch {name}: {memory_budget.format_size(n)} read ahead")
    level = 0 if policy == "none" else memory_budget.EXPERT_PREFETCH_LEVEL
    return {**memory_budget.server_env(), "DEEPSEEK_CPU_EXPERT_PREFETCH": str(level)}
