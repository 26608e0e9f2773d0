"""From a Hugging Face hub repo to a ready GGUF: download, convert, quantize, cache.

    from deepseek_cpu.hub import pull
    path = pull("deepseek-ai/DeepSeek-V2-Lite-Chat", quant="q4_k_m").path

Steps, each stopping with a one-line `PullError` saying what went wrong and what to do:

1. Resolve the revision to a commit sha (offline: from the local refs). If a GGUF for
   (repo, sha, quant, converter version) is cached, return it at once.
2. Pre-flight: fetch config.json alone and refuse architectures no converter handles;
   list the repo and pick what the converter reads (config, tokenizer files, the
   safetensors shards named by the index; never *.bin, *.pt, optimizer states or other
   formats); check free disk for download + conversion + output.
3. Download those files (revision pinned to the sha; token / HF_TOKEN, HF_ENDPOINT,
   HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE honoured, read at call time). Each file goes
   to a stable partial name in the HF cache (download.py), so a run that is killed or
   loses the network halfway through a shard continues it next time with a Range
   request; finished files are checked (size, sha256 of LFS files) before they count.
   Network errors are retried with backoff. `snapshot_download` then links the files
   into the standard snapshot layout (and is all that runs offline).
4. Convert (f32 / f16 / bf16 / q8_0 directly; other types through a bf16 intermediate
   quantized by llama.cpp's `llama_model_quantize`; quant_types.py says which is which),
   written to a temporary name and renamed, so an interrupted pull never leaves a
   truncated GGUF.

Layout of the GGUF cache, gguf/ under the cache root (cache.py: $DEEPSEEK_CPU_CACHE, default
~/.cache/deepseek-cpu, so ~/.cache/deepseek-cpu/gguf):
    <org>--<name>/<sha>/<converter key>/<name>-<quant>.gguf (+ .json record)
    <org>--<name>/refs/<revision>           last sha seen for a branch/tag (offline use)
With `output_dir` the GGUF is written as <output_dir>/<name>-<quant>.gguf with its
.json record next to it; the record decides whether it can be reused.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import __version__, quant_types
from .cache import cache_root
from .errors import DeepseekCpuError

log = logging.getLogger(__name__)

# Bump when the GGUF a given checkpoint converts to changes (tensor layout, metadata), so
# cached conversions made by an older converter are not reused.
CONVERTER_FORMAT = 1

# The types and their facts live in quant_types.py: written by our converter directly (no
# llama.cpp pass), or quantized by llama.cpp from a bf16 intermediate.
DIRECT = quant_types.DIRECT
QUANTS = quant_types.NAMES
INTERMEDIATE = "bf16"

# What the converter reads, besides the safetensors weights.
META_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
INDEX = "model.safetensors.index.json"

# Seconds to wait before each retry after a network error (huggingface_hub already
# retries a dropped transfer a few times itself, resuming from the bytes it has).
RETRY_DELAYS = (2.0, 5.0, 15.0, 30.0)


class PullError(DeepseekCpuError):
    """A pull cannot go on; the message says why and what to do (one line)."""

    network = False  # True when the hub could not be reached (or kept failing)
    cause: BaseException | None = None  # the exception it was made from


@dataclass
class PullResult:
    path: Path
    repo: str
    sha: str
    quant: str
    cached: bool


# -- settings read at call time (huggingface_hub reads its env vars at import) ---------

def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def hf_endpoint() -> str:
    from huggingface_hub import constants
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def hf_offline() -> bool:
    from huggingface_hub import constants
    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or bool(constants.HF_HUB_OFFLINE)


def gguf_cache_dir() -> Path:
    return cache_root() / "gguf"


def converter_key() -> str:
    return f"deepseek-cpu-{__version__}-fmt{CONVERTER_FORMAT}"


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds (or will hold) `path`."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def _device(path: Path) -> int:
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.stat().st_dev


# -- the pull ------------------------------------------------------------------------

def pull(repo: str, quant: str = quant_types.DEFAULT_PULL, revision: str | None = None, *,
         token: str | None = None, cache_dir: str | os.PathLike | None = None,
         output_dir: str | os.PathLike | None = None, delete_snapshot: bool = False,
         progress: bool = True, verbose: bool = False, echo=None) -> PullResult:
    """Download `repo` at `revision`, convert and quantize it to `quant`; returns where the GGUF is.

    `echo(str)` receives one-line status messages (default: the logger)."""
    say = echo or log.info
    quant = quant.lower()
    if quant not in QUANTS:
        raise PullError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise PullError(f"{repo!r} is not a hub repo id; give it as owner/name, e.g. deepseek-ai/DeepSeek-V2-Lite-Chat")
    revision = revision or "main"
    endpoint = hf_endpoint()
    hf_cache = Path(cache_dir) if cache_dir else hf_cache_dir()
    offline = hf_offline()
    ctx = _Ctx(repo, revision, endpoint, hf_cache, token, offline, progress)

    with _progress_bars(progress):
        sha = ctx.resolve()
        out, record = _target(repo, sha, quant, output_dir)
        if _reusable(out, record, repo, sha, quant):
            say(f"cached: {out}")
            _write_ref(repo, revision, sha)
            return PullResult(out, repo, sha, quant, cached=True)

        # pre-flight: architecture, file list, disk
        config = ctx.config(sha)
        _check_architecture(repo, config, ctx)
        files, sizes, weights_size = ctx.plan_files(sha)
        _check_disk(ctx, sha, files, sizes, weights_size, config, quant, out)

        snapshot = ctx.download(sha, files)
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        _convert(Path(snapshot), out, quant, progress, verbose, say, repo)
        _write_record(record, {"repo": repo, "revision": revision, "sha": sha, "quant": quant,
                               "converter": converter_key(), "created": time.time(),
                               "seconds": round(time.time() - t0, 1)})
        _write_ref(repo, revision, sha)
        if delete_snapshot:
            _delete_snapshot(hf_cache, repo, sha, say)
    return PullResult(out, repo, sha, quant, cached=False)


def _target(repo: str, sha: str, quant: str, output_dir) -> tuple[Path, Path]:
    name = repo.split("/")[-1]
    if output_dir is not None:
        out = Path(output_dir) / f"{name}-{quant}.gguf"
    else:
        out = gguf_cache_dir() / repo.replace("/", "--") / sha / converter_key() / f"{name}-{quant}.gguf"
    return out, out.with_name(out.name + ".json")


def _reusable(out: Path, record: Path, repo: str, sha: str, quant: str) -> bool:
    try:
        r = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    return (out.is_file() and r.get("repo") == repo and r.get("sha") == sha and r.get("quant") == quant
            and r.get("converter") == converter_key())


def _write_record(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _ref_path(repo: str, revision: str) -> Path:
    return gguf_cache_dir() / repo.replace("/", "--") / "refs" / revision


def _write_ref(repo: str, revision: str, sha: str) -> None:
    if revision == sha:
        return
    try:
        p = _ref_path(repo, revision)
        if p.is_file() and p.read_text().strip() == sha:
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        _atomic_text(p, sha)
    except OSError as e:  # the ref is a convenience for offline use only
        log.warning("could not record %s@%s -> %s: %s", repo, revision, sha, e)


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _Ctx:
    """One pull's connection settings and the huggingface_hub calls made with them."""

    def __init__(self, repo, revision, endpoint, cache_dir, token, offline, progress):
        self.repo, self.revision, self.endpoint = repo, revision, endpoint
        self.cache_dir, self.token, self.offline, self.progress = Path(cache_dir), token, offline, progress
        self.token_given = bool(token or os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"))

    @property
    def storage(self) -> Path:
        return self.cache_dir / ("models--" + self.repo.replace("/", "--"))

    @property
    def locks(self) -> Path:
        # the per-blob lock huggingface_hub itself takes
        return self.cache_dir / ".locks" / ("models--" + self.repo.replace("/", "--"))

    def api(self):
        from huggingface_hub import HfApi
        return HfApi(endpoint=self.endpoint, token=self.token)

    def call(self, what: str, fn):
        """Run a hub call, retrying network errors with backoff; hub errors -> PullError."""
        for attempt, delay in enumerate((*RETRY_DELAYS, None), start=1):
            try:
                return fn()
            except PullError:
                raise
            except Exception as e:  # noqa: BLE001 - classified below
                if delay is not None and _is_network_error(e):
                    # a 429 (or 503) says when to come back; retrying sooner only gets refused again
                    delay = max(delay, _retry_after(e))
                    log.warning("%s: network error (%s); retry %d of %d in %.0f s",
                                what, _short(e), attempt, len(RETRY_DELAYS), delay)
                    time.sleep(delay)
                    continue
                err = self.error(e, what)
                err.network = _is_network_error(e)
                err.cause = e
                raise err from None

    def error(self, e: Exception, what: str) -> PullError:
        from huggingface_hub import errors as E
        repo, rev, url = self.repo, self.revision, f"{self.endpoint}/{self.repo}"
        if isinstance(e, E.GatedRepoError):
            if self.token_given:
                return PullError(f"{repo} is gated and your token has no access: accept its conditions at {url} "
                                 "with the account the token belongs to")
            return PullError(f"{repo} is gated (401): accept its conditions at {url}, then pass --token "
                             "or set HF_TOKEN to a token of that account")
        if isinstance(e, E.RevisionNotFoundError):
            return PullError(f"{repo}: revision {rev!r} not found; give a branch, tag or commit sha that exists")
        if isinstance(e, E.RepositoryNotFoundError):
            hint = "" if self.token_given else "; if it is private, pass --token or set HF_TOKEN"
            return PullError(f"{repo}: repository not found on {self.endpoint} (check the name{hint})")
        if isinstance(e, E.EntryNotFoundError) or type(e).__name__ in ("RemoteEntryNotFoundError",):
            return PullError(f"{repo}@{rev}: {what}: file not found in the repo; is this a Hugging Face "
                             "transformers checkpoint?")
        if isinstance(e, E.OfflineModeIsEnabled) or (self.offline and isinstance(e, E.LocalEntryNotFoundError)):
            return PullError(f"{repo}@{rev} is not in the local cache ({self.cache_dir}) and HF_HUB_OFFLINE=1: "
                             "run the pull once with network access")
        if _is_network_error(e) and _is_server_error(e):
            return PullError(f"{self.endpoint} keeps failing for {repo} after {len(RETRY_DELAYS) + 1} tries "
                             f"({_short(e)}); try again later: files already downloaded are kept")
        if _is_network_error(e):
            return PullError(f"cannot reach {self.endpoint} for {repo} after {len(RETRY_DELAYS) + 1} tries "
                             f"({_short(e)}); check the network and run again: files already downloaded "
                             "are kept")
        if isinstance(e, E.HfHubHTTPError):
            return PullError(f"{repo}: {what} failed: {_short(e)}")
        if isinstance(e, OSError):
            return PullError(f"{repo}: {what} failed: {e}")
        return PullError(f"{repo}: {what} failed: {type(e).__name__}: {_short(e)}")

    # -- steps ---------------------------------------------------------------------
    def resolve(self) -> str:
        if re.fullmatch(r"[0-9a-f]{40}", self.revision):
            return self.revision
        if not self.offline:
            try:
                return self.call(f"resolving {self.revision}",
                                 lambda: self.api().repo_info(self.repo, revision=self.revision).sha)
            except PullError as e:
                sha = self.local_sha() if e.network else None
                if sha is None:
                    raise
                log.warning("%s: hub unreachable; using the cached %s = %s", self.repo, self.revision, sha[:12])
                return sha
        sha = self.local_sha()
        if sha is None:
            raise PullError(f"{self.repo}@{self.revision} has never been pulled here and HF_HUB_OFFLINE=1: "
                            "run the pull once with network access")
        return sha

    def local_sha(self) -> str | None:
        for p in (self.storage / "refs" / self.revision, _ref_path(self.repo, self.revision)):
            try:
                sha = p.read_text().strip()
            except OSError:
                continue
            if re.fullmatch(r"[0-9a-f]{40}", sha):
                return sha
        return None

    def fetch(self, sha: str, filename: str) -> Path:
        from huggingface_hub import hf_hub_download
        return Path(self.call(f"downloading {filename}", lambda: hf_hub_download(
            self.repo, filename, revision=sha, cache_dir=self.cache_dir, token=self.token,
            endpoint=self.endpoint, local_files_only=self.offline)))

    def config(self, sha: str) -> dict:
        path = self.fetch(sha, "config.json")
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise PullError(f"{self.repo}: config.json is not valid JSON ({e})") from None

    def list_files(self, sha: str) -> dict[str, int]:
        """Top-level files of the repo at `sha` and their sizes."""
        if self.offline:
            snap = self.storage / "snapshots" / sha
            return {p.name: p.stat().st_size for p in snap.iterdir() if p.is_file()} if snap.is_dir() else {}
        from huggingface_hub.hf_api import RepoFile
        entries = self.call("listing files", lambda: list(self.api().list_repo_tree(self.repo, revision=sha)))
        return {e.path: int(e.size or 0) for e in entries if isinstance(e, RepoFile) and "/" not in e.path}

    def plan_files(self, sha: str) -> tuple[list[str], dict[str, int], int]:
        """The files to download, the sizes of all files and the total size of the weights."""
        listing = self.list_files(sha)
        if "tokenizer.json" not in listing:
            raise PullError(f"{self.repo}: no tokenizer.json in the repo (only Hugging Face 'fast' tokenizers "
                            "are supported)")
        if INDEX in listing:
            index = json.loads(self.fetch(sha, INDEX).read_text())
            shards = sorted(set((index.get("weight_map") or {}).values()))
            missing = [s for s in shards if s not in listing]
            if missing or not shards:
                raise PullError(f"{self.repo}: {INDEX} names shards the repo does not have: {', '.join(missing[:3])}")
        else:
            shards = sorted(f for f in listing if f.endswith(".safetensors"))
        if not shards:
            others = sorted(f for f in listing if f.endswith((".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")))
            found = f" (it has {', '.join(others[:3])})" if others else ""
            raise PullError(f"{self.repo}: no safetensors weights at {self.revision}{found}; only safetensors "
                            "checkpoints can be converted")
        files = [f for f in META_FILES if f in listing] + ([INDEX] if INDEX in listing else []) + shards
        return files, listing, sum(listing[s] for s in shards)

    def missing_bytes(self, sha: str, files: list[str], sizes: dict[str, int]) -> int:
        snap = self.storage / "snapshots" / sha
        return sum(sizes.get(f, 0) for f in files if not (snap / f).exists())

    def download(self, sha: str, files: list[str]) -> str:
        from huggingface_hub import snapshot_download
        if not self.offline:
            from .download import ChecksumError, ensure_blob
            snap = self.storage / "snapshots" / sha
            for f in files:
                if (snap / f).exists():
                    continue
                for attempt in (1, 2):  # a bad checksum removes the partial file: start over once
                    try:
                        self.call(f"downloading {f}", lambda f=f: ensure_blob(
                            self.repo, f, sha, storage=self.storage, locks=self.locks, endpoint=self.endpoint,
                            token=self.token))
                        break
                    except PullError as e:
                        if attempt == 2 or not isinstance(e.cause, ChecksumError):
                            raise
                        log.warning("%s", e)
        # links the blobs into the snapshot (and fetches anything the loop above did not)
        patterns = [re.sub(r"([*?\[])", r"[\1]", f) for f in files]
        return self.call("downloading", lambda: snapshot_download(
            self.repo, revision=sha, allow_patterns=patterns, cache_dir=self.cache_dir, token=self.token,
            endpoint=self.endpoint, local_files_only=self.offline))


def _check_architecture(repo: str, config: dict, ctx: _Ctx) -> None:
    from .convert import find_converter, supported_architectures
    from .converters.base import ConversionError, UnsupportedArchitecture
    try:
        find_converter(config, ctx.storage)
    except UnsupportedArchitecture:
        archs = config.get("architectures") or [config.get("model_type", "unknown")]
        raise PullError(f"{repo}: architecture {', '.join(map(str, archs))} is not supported (supported: "
                        f"{', '.join(supported_architectures())}); no weights were downloaded") from None
    except ConversionError as e:
        raise PullError(f"{repo}: config.json cannot be converted: {str(e).split(': ', 1)[-1]}") from None


def _bytes_per_param(config: dict) -> float:
    q = config.get("quantization_config") or {}
    if "fp8" in str(q.get("quant_method", "")).lower() or "e4m3" in str(q.get("fmt", "")).lower():
        return 1.0
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return 4.0 if "32" in dtype else 2.0


def estimate_disk(weights_size: int, download: int, config: dict, quant: str) -> dict[str, int]:
    """Bytes needed for the download, the conversion intermediate and the output."""
    n_params = weights_size / _bytes_per_param(config)
    intermediate = 0 if quant in DIRECT else int(n_params * 2)
    output = int(n_params * quant_types.QUANT_TYPES[quant].bpw / 8)
    return {"download": int(download), "intermediate": intermediate, "output": output}


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _check_disk(ctx: _Ctx, sha: str, files: list[str], sizes: dict[str, int], weights_size: int,
                config: dict, quant: str, out: Path) -> None:
    need = estimate_disk(weights_size, ctx.missing_bytes(sha, files, sizes), config, quant)
    margin = lambda n: int(n * 1.02) + (16 << 20) if n else 0  # noqa: E731
    groups: dict[int, tuple[Path, int, list[str]]] = {}
    for what, where in (("download", ctx.cache_dir), ("intermediate", out.parent), ("output", out.parent)):
        if not need[what]:
            continue
        dev = _device(where)
        path, total, parts = groups.get(dev, (where, 0, []))
        groups[dev] = (path, total + need[what], parts + [f"{what} {_gib(need[what])}"])
    for path, total, parts in groups.values():
        free = free_bytes(path)
        if free < margin(total):
            raise PullError(f"not enough disk space on {path}: need {_gib(margin(total))} "
                            f"({' + '.join(parts)} + margin), {_gib(free)} free; free some space or choose "
                            "another place (--output-dir, --cache-dir / HF_HOME)")


# -- conversion ----------------------------------------------------------------------

def _convert(snapshot: Path, out: Path, quant: str, progress: bool, verbose: bool, say, name: str) -> None:
    from .convert import convert
    try:
        if quant in DIRECT:
            say(f"converting to {quant}")
            convert(snapshot, out, outtype=quant, progress=progress, name=name)
        else:
            tmp = out.with_name(f"{out.stem}.{INTERMEDIATE}-intermediate-{os.getpid()}.gguf")
            try:
                say(f"converting to {INTERMEDIATE} (intermediate)")
                convert(snapshot, tmp, outtype=INTERMEDIATE, progress=progress, name=name)
                say(f"quantizing to {quant} with llama.cpp")
                quantize(tmp, out, quant, verbose=verbose, progress=progress)
            finally:
                tmp.unlink(missing_ok=True)
    except PullError:  # quantize()'s own, already worded for the user
        raise
    except DeepseekCpuError as e:  # any converter error (the root spares a list to keep in step)
        raise PullError(f"conversion failed: {e}") from None
    _public_mode(out)


def _public_mode(path: Path) -> None:
    """convert() writes through mkstemp (mode 0600); a cache file should follow the umask."""
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(path, 0o666 & ~mask)
    except OSError:
        pass


def quantize(src: Path, out: Path, quant: str, verbose: bool = False, progress: bool = True,
             nthread: int | None = None) -> Path:
    """llama.cpp's quantizer, `src` GGUF -> `out` (written to a temporary name, then renamed)."""
    import sys

    from . import llama as _ds_llama  # noqa: F401  (loads the patched engine first)
    import llama_cpp
    from tqdm import tqdm

    from .resources import default_threads
    src, out = Path(src), Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    qt = quant_types.QUANT_TYPES.get(quant)
    ftype = getattr(llama_cpp, qt.llama_ftype, None) if qt is not None else None
    if ftype is None:
        raise PullError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    params.ftype = ftype
    params.nthread = nthread or default_threads()
    # llama-cpp-python prints llama.cpp's log through a callback to sys.stderr, at or above
    # the level of its "llama-cpp-python" logger: let it all through, into a buffer that
    # drives a progress bar from the "[ i/ n] tensor" lines and keeps the text for errors.
    llog = logging.getLogger("llama-cpp-python")
    level = llog.level
    llog.setLevel(logging.DEBUG)
    bar = tqdm(total=None, unit="tensor", desc=f"{out.name} ({quant})", leave=False, file=sys.stderr,
               disable=verbose or not progress)
    sink = _QuantLog(bar)
    try:
        with (contextlib.nullcontext() if verbose else contextlib.redirect_stderr(sink)):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0 or not tmp.is_file():
            lines = [ln.strip() for ln in sink.text().splitlines() if ln.strip()]
            detail = lines[-1] if lines else "no message"
            raise PullError(f"llama.cpp could not quantize to {quant} (code {rc}: {detail}); "
                            "try another --quant, e.g. q8_0")
        os.replace(tmp, out)
    finally:
        bar.close()
        llog.setLevel(level)
        tmp.unlink(missing_ok=True)
    return out


class _QuantLog(io.TextIOBase):
    _STEP = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")

    def __init__(self, bar):
        self.bar, self.parts = bar, []

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.parts.append(s)
        for m in self._STEP.finditer(s):
            self.bar.total = int(m[2])
            self.bar.update(int(m[1]) - self.bar.n)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


def _delete_snapshot(cache_dir: Path, repo: str, sha: str, say) -> None:
    from huggingface_hub import scan_cache_dir
    try:
        strategy = scan_cache_dir(cache_dir).delete_revisions(sha)
        strategy.execute()
        say(f"deleted the downloaded checkpoint ({strategy.expected_freed_size_str})")
    except Exception as e:  # noqa: BLE001 - the GGUF is done; a failed clean-up is only reported
        log.warning("could not delete the snapshot of %s@%s: %s", repo, sha[:12], e)


# -- helpers -------------------------------------------------------------------------

def _network_error_types() -> tuple[type, ...]:
    types: list[type] = [ConnectionError, TimeoutError]
    for mod, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                       ("requests", ("ConnectionError", "Timeout"))):
        try:
            m = __import__(mod)
        except ImportError:
            continue
        types += [getattr(m, n) for n in names if isinstance(getattr(m, n, None), type)]
    return tuple(types)


def _is_network_error(e: BaseException | None) -> bool:
    from huggingface_hub import errors as E
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, E.OfflineModeIsEnabled):
            return False
        if isinstance(e, _network_error_types()):
            return True
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return True
        if isinstance(e, E.HfHubHTTPError) and getattr(e, "response", None) is not None:
            if e.response.status_code in (408, 429) or e.response.status_code >= 500:
                return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _is_server_error(e: BaseException) -> bool:
    from huggingface_hub import errors as E
    resp = getattr(e, "response", None) if isinstance(e, E.HfHubHTTPError) else None
    return resp is not None and (resp.status_code >= 500 or resp.status_code in (408, 429))


def _retry_after(e: BaseException) -> float:
    """Seconds the hub asked us to wait (`Retry-After`, else its `RateLimit` reset), or 0."""
    from huggingface_hub.utils import parse_ratelimit_headers
    resp = getattr(e, "response", None)
    if resp is None or resp.status_code not in (429, 503):
        return 0.0
    value = (resp.headers.get("Retry-After") or "").strip()
    if value.isdigit():
        return float(value)
    info = parse_ratelimit_headers(resp.headers)
    return float(info.reset_in_seconds) if info is not None and info.remaining == 0 else 0.0


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]


@contextlib.contextmanager
def _progress_bars(enabled: bool):
    if enabled:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    was = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was:
            enable_progress_bars()
