"""A local stand-in for the Hugging Face hub, serving files the way huggingface.co does.

Serves directories as model repos over the routes `huggingface_hub` (2.x) uses for
`snapshot_download` / `hf_hub_download` / `HfApi.repo_info` / `list_repo_tree`:

    GET       /api/models/{repo}[/revision/{rev}]        repo info (id, sha, siblings)
    GET       /api/models/{repo}/tree/{rev}[?recursive=]  file listing (path, size, oid, lfs)
    HEAD/GET  /{repo}/resolve/{rev}/{path}                see below

and, on a second host (the CDN: 127.0.0.2, another name for loopback):

    HEAD/GET  /repos/{aa}/{bb}/{sha256}?...&Expires=&Signature=   LFS bytes; Range -> 206

As on huggingface.co (what `get_hf_file_metadata` and `http_get` are written against):
- an LFS file (weights by extension, or anything over the hub's 10 MB limit for plain git
  files) is not served by the hub: `/resolve/` answers 302 to a signed URL on the CDN host,
  with `X-Linked-Etag: "<sha256>"`, `X-Linked-Size`, `X-Repo-Commit`. The 302's own `ETag`
  is the weak ETag of its text body, and the CDN's `ETag` is an S3-style md5: only a client
  that reads X-Linked-Etag gets the sha256. The CDN honours Range (206) and no token is
  needed there (the log records whether one was sent anyway);
- a plain file is served by the hub itself, `ETag: "<git blob sha1>"`, gzip-compressed
  with chunked transfer (no Content-Length) to a GET that accepts gzip and asks no Range;
- the hub rate-limits `/resolve/` (429, `Retry-After`, `RateLimit`) when a test asks, and
  keeps refusing until the Retry-After has passed, as a real rate limiter does.

Errors carry the hub's `X-Error-Code` header (RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo), which huggingface_hub turns into its typed exceptions.

    with HubServer({"org/tiny": fixture_dir("v2_group")}) as hub:  # conftest.fixture_dir
        os.environ["HF_ENDPOINT"] = hub.url
        hub.gated["org/tiny"] = "secret"      # requests need `Authorization: Bearer secret`
        hub.cut_once["model-00001-of-00002.safetensors"] = 1000  # drop the connection once
        hub.stall_once["model-00001-of-00002.safetensors"] = 1000  # send 1000 bytes, then hang
        hub.corrupt_once["model-00001-of-00002.safetensors"] = 5000  # flip that byte once, in transit
        hub.rate_limit_once["model-00001-of-00002.safetensors"] = 1  # 429, Retry-After: 1
        hub.fail_next = 2                     # the next 2 requests to the hub get 503
        ...
        hub.requests                          # [Request(method, path, range, host, file, auth, status)]

The servers bind loopback on free ports, serve from daemon threads, and shut themselves
down after `lifetime` seconds even if the test forgets to.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import json
import math
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<sub>/.*)?)?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/repos/[0-9a-f]{2}/[0-9a-f]{2}/(?P<sha256>[0-9a-f]{64})$")

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npz", ".gguf", ".h5", ".msgpack")
LFS_MIN_SIZE = 10 * 1000 * 1000  # the hub refuses plain git files above 10 MB
URL_TTL = 3600  # seconds a signed CDN URL stays valid
clock = time.monotonic  # the rate limiter's clock (a test may set it to a reading of its choice)


class Request(NamedTuple):
    method: str
    path: str
    range: str | None
    host: str          # "hub" or "cdn"
    file: str | None   # the repo file the request is about (None for the API)
    auth: bool         # an Authorization header was sent
    status: int


class Repo:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.files = sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())
        h = hashlib.sha1()
        self.sha256, self.size = {}, {}
        for f in self.files:
            data = (self.root / f).read_bytes()
            self.sha256[f], self.size[f] = hashlib.sha256(data).hexdigest(), len(data)
            h.update(f.encode() + b"\0" + self.sha256[f].encode())
        self.sha = h.hexdigest()  # 40 hex, like a git commit

    def data(self, f: str) -> bytes:
        return (self.root / f).read_bytes()

    def git_oid(self, f: str) -> str:
        data = self.data(f)
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def is_lfs(self, f: str) -> bool:
        return f.endswith(LFS_SUFFIXES) or self.size[f] > LFS_MIN_SIZE


class HubServer:
    def __init__(self, repos: dict[str, Path], lifetime: float = 600):
        self.repos = {name: Repo(path) for name, path in repos.items()}
        self.gated: dict[str, str] = {}     # repo -> the token that opens it
        self.cut_once: dict[str, int] = {}  # file path -> bytes sent before dropping the connection (once)
        self.stall_once: dict[str, int] = {}  # file path -> bytes sent before the response hangs (once)
        self.corrupt_once: dict[str, int] = {}  # file path -> offset of a byte sent flipped (once)
        self.rate_limit_once: dict[str, int] = {}  # file path -> Retry-After of a 429 to its next resolve
        self.fail_next = 0                  # answer this many next hub requests with 503 (hub down)
        self.requests: list[Request] = []
        self.lifetime = lifetime
        self._lock = threading.Lock()
        self._unstall = threading.Event()
        self._limited_until = 0.0           # time.monotonic() before which /resolve/ answers 429
        self._secret = b"cdn-signing-key"
        self.httpd = self._serve("hub", "127.0.0.1")
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        try:
            self.cdn_httpd = self._serve("cdn", "127.0.0.2")
            self.cdn_url = f"http://127.0.0.2:{self.cdn_httpd.server_address[1]}"
        except OSError:  # no 127.0.0.2 (macOS): same address, but reached by another name
            self.cdn_httpd = self._serve("cdn", "127.0.0.1")
            self.cdn_url = f"http://localhost:{self.cdn_httpd.server_address[1]}"
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
                         for s in (self.httpd, self.cdn_httpd)]
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    def _serve(self, host: str, addr: str) -> ThreadingHTTPServer:
        httpd = ThreadingHTTPServer((addr, 0), type("Handler", (_Handler,), {"hub": self, "host": host}))
        httpd.daemon_threads = True
        return httpd

    def add(self, name: str, path: Path) -> Repo:
        self.repos[name] = Repo(path)
        return self.repos[name]

    def start(self) -> "HubServer":
        for t in self._threads:
            t.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._unstall.set()
        self._timer.cancel()
        for s in (self.httpd, self.cdn_httpd):
            s.shutdown()
            s.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def record(self, r: Request) -> None:
        with self._lock:
            self.requests.append(r)

    def fetched(self, suffix: str = "") -> list[str]:
        """The files whose bytes were sent (GET answered 200/206, by the hub or the CDN), optionally by suffix."""
        return [r.file for r in self.requests
                if r.method == "GET" and r.status in (200, 206) and r.file and r.file.endswith(suffix)]

    def transfers(self, f: str) -> list[tuple[str, str | None]]:
        """(host, Range header) of each response that sent bytes of file `f`, in order."""
        return [(r.host, r.range) for r in self.requests if r.method == "GET" and r.status in (200, 206) and r.file == f]

    # -- the CDN's signed URLs ------------------------------------------------------------
    def _signature(self, path: str, expires: str) -> str:
        return hmac.new(self._secret, f"{path}:{expires}".encode(), hashlib.sha256).hexdigest()[:32]

    def signed_url(self, sha256: str, filename: str) -> str:
        path = f"/repos/{sha256[:2]}/{sha256[2:4]}/{sha256}"
        expires = str(int(time.time()) + URL_TTL)
        name = quote(filename.rsplit("/", 1)[-1])
        disposition = quote(f"attachment; filename*=UTF-8''{name}; filename=\"{name}\";", safe="")
        return (f"{self.cdn_url}{path}?response-content-disposition={disposition}"
                f"&Expires={expires}&Signature={self._signature(path, expires)}")

    def lfs_object(self, sha256: str) -> tuple[Repo, str] | None:
        for repo in self.repos.values():
            for f in repo.files:
                if repo.sha256[f] == sha256 and repo.is_lfs(f):
                    return repo, f
        return None


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    host: str
    protocol_version = "HTTP/1.1"
    _file: str | None = None

    def log_message(self, *args):  # quiet
        pass

    def send_response(self, code, message=None):
        # every answer goes through here: log it with its status and the file it is about
        self.hub.record(Request(self.command, unquote(urlsplit(self.path).path), self.headers.get("Range"),
                                self.host, self._file, "Authorization" in self.headers, code))
        super().send_response(code, message)

    # -- helpers --------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _json(self, obj, status: int = 200, head: bool = False):
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head=head)

    def _error(self, status: int, code: str, message: str, head: bool = False, headers: dict | None = None):
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message,
                    **(headers or {})}, head=head)

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
        self._file = None
        url = urlsplit(self.path)
        path = unquote(url.path)
        if self.host == "cdn":
            return self._cdn(path, parse_qs(url.query), head)
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
            self._file = m["path"]
            if self._rate_limited(m["path"], head):
                return
            repo = self._repo(m["repo"], head)
            if repo is None or not self._rev(repo, m["rev"], head):
                return
            if m["path"] not in repo.files:
                return self._error(404, "EntryNotFound", f"{m['path']} does not exist", head,
                                   {"X-Repo-Commit": repo.sha})
            return self._resolve(repo, m["path"], head)
        self._error(404, "RepoNotFound", "no such route", head)

    def _rate_limited(self, f: str, head: bool) -> bool:
        with self.hub._lock:
            now = clock()
            if f in self.hub.rate_limit_once:
                # the refusal that opens the window says exactly the window: (now + s) - now
                # is not s in floating point, and ceil() of 3600.0000000000005 said 3601
                s = self.hub.rate_limit_once.pop(f)
                self.hub._limited_until = now + s
            else:
                wait = self.hub._limited_until - now
                if wait <= 0:
                    return False
                s = max(1, math.ceil(wait - 1e-6))  # the whole seconds left, as a real limiter counts
        self._error(429, "RateLimited", "You have exceeded our rate limit for resolvers; retry later", head,
                    {"Retry-After": str(s), "RateLimit": f'"resolvers";r=0;t={s}',
                     "RateLimit-Policy": '"fixed window";"resolvers";q=3000;w=300'})
        return True

    def _tree_entry(self, repo: Repo, f: str) -> dict:
        if not repo.is_lfs(f):
            return {"type": "file", "path": f, "size": repo.size[f], "oid": repo.git_oid(f)}
        # git holds an LFS file as a pointer: the entry's oid is the pointer's, the content's is the sha256
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{repo.sha256[f]}\nsize {repo.size[f]}\n"
        oid = hashlib.sha1(b"blob %d\0%s" % (len(pointer), pointer.encode())).hexdigest()
        return {"type": "file", "path": f, "size": repo.size[f], "oid": oid,
                "lfs": {"oid": repo.sha256[f], "size": repo.size[f], "pointerSize": len(pointer)}}

    def _resolve(self, repo: Repo, f: str, head: bool):
        if not repo.is_lfs(f):
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.git_oid(f)}"'}
            return self._bytes(f, repo.data(f), headers, head, gzip_ok=True)
        location = self.hub.signed_url(repo.sha256[f], f)
        body = f"Found. Redirecting to {location}".encode()
        # the 302's own ETag is that of its body (Express style): the file's is in X-Linked-Etag
        weak = f'W/"{len(body):x}-{base64.b64encode(hashlib.sha1(body).digest()).decode()[:27]}"'
        self._send(302, body, {"Location": location, "Content-Type": "text/plain; charset=utf-8",
                               "X-Repo-Commit": repo.sha, "X-Linked-Etag": f'"{repo.sha256[f]}"',
                               "X-Linked-Size": str(repo.size[f]), "ETag": weak, "Accept-Ranges": "bytes"},
                   head=head)

    def _cdn(self, path: str, query: dict, head: bool):
        m = _CDN.match(path)
        found = self.hub.lfs_object(m["sha256"]) if m else None
        if found is None:
            return self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", {"Content-Type": "application/xml"},
                              head)
        repo, f = found
        self._file = f
        expires, sig = query.get("Expires", [""])[0], query.get("Signature", [""])[0]
        if not (expires.isdigit() and int(expires) > time.time()
                and hmac.compare_digest(sig, self.hub._signature(path, expires))):
            return self._send(403, b"<Error><Code>AccessDenied</Code></Error>", {"Content-Type": "application/xml"},
                              head)
        data = repo.data(f)
        headers = {"ETag": f'"{hashlib.md5(data).hexdigest()}"',  # S3's, not the sha256
                   "Content-Disposition": query.get("response-content-disposition", ["attachment"])[0]}
        self._bytes(f, data, headers, head, gzip_ok=False)

    def _bytes(self, f: str, data: bytes, headers: dict, head: bool, gzip_ok: bool):
        """Send `data` (the whole file `f`), honouring Range, with the test's faults applied."""
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        start, status, size = 0, 200, len(data)
        rng = self.headers.get("Range")
        if rng and not head:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m:
                start = int(m[1])
                end = min(int(m[2]) if m[2] else size - 1, size - 1)
                if start >= size:
                    return self._send(416, b"", {"Content-Range": f"bytes */{size}"})
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
                data, status = data[start:end + 1], 206
        cut = stall = flip = None
        if not head:
            with self.hub._lock:
                cut = self.hub.cut_once.pop(f, None)
                stall = self.hub.stall_once.pop(f, None)
                sent = min([len(data), *(n for n in (cut, stall) if n is not None)])
                if start <= self.hub.corrupt_once.get(f, -1) < start + sent:
                    flip = self.hub.corrupt_once.pop(f) - start
        if flip is not None:
            data = data[:flip] + bytes([data[flip] ^ 0xFF]) + data[flip + 1:]
        chunked = (gzip_ok and not head and status == 200 and cut is None and stall is None
                   and "gzip" in self.headers.get("Accept-Encoding", ""))
        if chunked:
            data = gzip.compress(data)
            headers.update({"Content-Encoding": "gzip", "Transfer-Encoding": "chunked"})
        else:
            headers["Content-Length"] = str(len(data))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        if chunked:
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        elif stall is not None and stall < len(data):
            # a transfer that stops moving (the client is killed meanwhile); ends with the server
            self.wfile.write(data[:stall])
            self.wfile.flush()
            self.hub._unstall.wait(self.hub.lifetime)
            self.close_connection = True
        elif cut is not None and cut < len(data):
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        else:
            self.wfile.write(data)
