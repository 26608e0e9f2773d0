"""A local stand-in for the Hugging Face hub, enough for huggingface_hub's downloads.

Serves directories as model repos over the routes `huggingface_hub` (2.x) uses for
`snapshot_download` / `hf_hub_download` / `HfApi.repo_info` / `list_repo_tree`:

    GET       /api/models/{repo}[/revision/{rev}]        repo info (id, sha, siblings)
    GET       /api/models/{repo}/tree/{rev}[?recursive=]  file listing (path, size, oid, lfs)
    HEAD/GET  /{repo}/resolve/{rev}/{path}                file bytes; X-Repo-Commit, ETag,
                                                          Content-Length, Range -> 206

Errors carry the hub's `X-Error-Code` header (RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo), which huggingface_hub turns into its typed exceptions.

    with HubServer({"org/tiny": Path("tests/fixtures/v2_group")}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        hub.gated["org/tiny"] = "secret"      # requests need `Authorization: Bearer secret`
        hub.cut_once["model-00001-of-00002.safetensors"] = 1000  # drop the connection once
        hub.stall_once["model-00001-of-00002.safetensors"] = 1000  # send 1000 bytes, then hang
        hub.fail_next = 2                     # the next 2 requests get 503
        ...
        hub.requests                          # [(method, path, range header), ...]

The server binds 127.0.0.1 on a free port, serves from a daemon thread, and shuts
itself down after `lifetime` seconds even if the test forgets to.
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<sub>/.*)?)?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class Repo:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.files = sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())
        h = hashlib.sha1()
        self.sha256 = {}
        for f in self.files:
            data = (self.root / f).read_bytes()
            self.sha256[f] = hashlib.sha256(data).hexdigest()
            h.update(f.encode() + b"\0" + self.sha256[f].encode())
        self.sha = h.hexdigest()  # 40 hex, like a git commit

    def git_oid(self, f: str) -> str:
        data = (self.root / f).read_bytes()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer:
    def __init__(self, repos: dict[str, Path], lifetime: float = 600):
        self.repos = {name: Repo(path) for name, path in repos.items()}
        self.gated: dict[str, str] = {}     # repo -> the token that opens it
        self.cut_once: dict[str, int] = {}  # file path -> bytes sent before dropping the connection (once)
        self.stall_once: dict[str, int] = {}  # file path -> bytes sent before the response hangs (once)
        self.fail_next = 0                  # answer this many next requests with 503 (hub down)
        self.requests: list[tuple[str, str, str | None]] = []
        self.lifetime = lifetime
        self._lock = threading.Lock()
        self._unstall = threading.Event()
        handler = type("Handler", (_Handler,), {"hub": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    def add(self, name: str, path: Path) -> Repo:
        self.repos[name] = Repo(path)
        return self.repos[name]

    def start(self) -> "HubServer":
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._unstall.set()
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def record(self, method: str, path: str, rng: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, rng))

    def fetched(self, suffix: str = "") -> list[str]:
        """Paths of the files whose bytes were requested (GET on resolve), optionally by suffix."""
        out = []
        for method, path, _ in self.requests:
            m = _RESOLVE.match(path)
            if method == "GET" and m and m["path"].endswith(suffix):
                out.append(m["path"])
        return out


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    # -- helpers --------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)) if not (headers and "Content-Length" in headers) else headers["Content-Length"])
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _json(self, obj, status: int = 200, head: bool = False):
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head=head)

    def _error(self, status: int, code: str, message: str, head: bool = False):
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head=head)

    def _repo(self, name: str, head: bool) -> Repo | None:
        repo = self.hub.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head)
            return None
        token = self.hub.gated.get(name)
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            self._error(401, "GatedRepo", f"Access to model {name} is restricted. You must have access to it "
                                         "and be authenticated to access it. Please log in.", head)
            return None
        return repo

    def _rev(self, repo: Repo, rev: str, head: bool) -> bool:
        if unquote(rev) in ("main", repo.sha):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {unquote(rev)}", head)
        return False

    # -- routes ---------------------------------------------------------------------
    def do_HEAD(self):
        self._handle(head=True)

    def do_GET(self):
        self._handle(head=False)

    def _handle(self, head: bool):
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.hub.record(self.command, path, self.headers.get("Range"))
        with self.hub._lock:
            down = self.hub.fail_next > 0
            self.hub.fail_next -= down
        if down:
            return self._send(503, b"Service Unavailable", {"Content-Type": "text/plain"}, head=head)
        m = _API.match(path)
        if m:
            repo = self._repo(m["repo"], head)
            if repo is None or not self._rev(repo, m["rev"] or "main", head):
                return
            if m["kind"] == "tree":
                return self._json([self._tree_entry(repo, f) for f in repo.files], head=head)
            return self._json({"id": m["repo"], "modelId": m["repo"], "sha": repo.sha, "private": False,
                               "gated": "auto" if m["repo"] in self.hub.gated else False,
                               "siblings": [{"rfilename": f} for f in repo.files]}, head=head)
        m = _RESOLVE.match(path)
        if m:
            repo = self._repo(m["repo"], head)
            if repo is None or not self._rev(repo, m["rev"], head):
                return
            if m["path"] not in repo.files:
                return self._error(404, "EntryNotFound", f"{m['path']} does not exist", head)
            return self._file(repo, m["path"], head)
        self._error(404, "RepoNotFound", "no such route", head)

    def _tree_entry(self, repo: Repo, f: str) -> dict:
        size = (repo.root / f).stat().st_size
        entry = {"type": "file", "path": f, "size": size, "oid": repo.git_oid(f)}
        if f.endswith((".safetensors", ".npz", ".bin")):
            entry["lfs"] = {"oid": repo.sha256[f], "size": size, "pointerSize": 134}
        return entry

    def _file(self, repo: Repo, f: str, head: bool):
        data = (repo.root / f).read_bytes()
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.sha256[f]}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and not head:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m:
                start = int(m[1])
                end = int(m[2]) if m[2] else len(data) - 1
                if start >= len(data):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                data, status = data[start:end + 1], 206
        headers["Content-Length"] = str(len(data))
        cut = stall = None
        if not head:
            with self.hub._lock:
                cut = self.hub.cut_once.pop(f, None)
                stall = self.hub.stall_once.pop(f, None)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        if stall is not None and stall < len(data):
            # a transfer that stops moving (the client is killed meanwhile); ends with the server
            self.wfile.write(data[:stall])
            self.wfile.flush()
            self.hub._unstall.wait(self.hub.lifetime)
            self.close_connection = True
            return
        if cut is not None and cut < len(data):
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.wfile.write(data)


