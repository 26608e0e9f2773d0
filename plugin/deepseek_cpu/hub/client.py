"""The pull's Hugging Face client: each huggingface_hub call, retried, its errors worded.

`HubClient` holds one pull's connection settings (repo, revision, endpoint, HF cache, token,
offline) and makes the calls with them: resolve the revision, fetch one file, list the
repo, choose the files to download, download them. `call()` retries network errors with
backoff (honouring a 429's Retry-After) and turns anything else into a one-line
`PullError` (`error()`). huggingface_hub is imported inside the methods: importing this
module stays cheap.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path

from .errors import PullError, is_network_error, is_server_error, retry_after, short
from .gguf_cache import ref_path

log = logging.getLogger("deepseek_cpu.hub")  # the pull's one logger (see gguf_cache.py)

# What the converter reads, besides the safetensors weights.
META_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
INDEX = "model.safetensors.index.json"

# Seconds to wait before each retry after a network error (huggingface_hub already
# retries a dropped transfer a few times itself, resuming from the bytes it has).
RETRY_DELAYS = (2.0, 5.0, 15.0, 30.0)
# the longest Retry-After a pull waits out; a longer one ends the pull with a clear message
MAX_RETRY_AFTER = 300.0


class HubClient:
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
                wait = retry_after(e)
                if wait > MAX_RETRY_AFTER:
                    # a pull that sleeps for an hour looks hung; say when to come back instead
                    raise PullError(f"{what}: the hub rate-limits this client for {wait:.0f} s "
                                    f"({short(e)}); try again later, or pass --token / set HF_TOKEN "
                                    f"(logged-in users get higher limits)") from None
                if delay is not None and is_network_error(e):
                    # a 429 (or 503) says when to come back; retrying sooner only gets refused again
                    delay = max(delay, wait)
                    log.warning("%s: network error (%s); retry %d of %d in %.0f s",
                                what, short(e), attempt, len(RETRY_DELAYS), delay)
                    time.sleep(delay)
                    continue
                err = self.error(e, what)
                err.network = is_network_error(e)
                err.cause = e
                raise err from None

    def error(self, e: Exception, what: str) -> PullError:
        """`e`, from huggingface_hub or the network, as one line saying what to do."""
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
        if is_network_error(e) and is_server_error(e):
            return PullError(f"{self.endpoint} keeps failing for {repo} after {len(RETRY_DELAYS) + 1} tries "
                             f"({short(e)}); try again later: files already downloaded are kept")
        if is_network_error(e):
            return PullError(f"cannot reach {self.endpoint} for {repo} after {len(RETRY_DELAYS) + 1} tries "
                             f"({short(e)}); check the network and run again: files already downloaded "
                             "are kept")
        if isinstance(e, E.HfHubHTTPError):
            return PullError(f"{repo}: {what} failed: {short(e)}")
        if isinstance(e, OSError):
            return PullError(f"{repo}: {what} failed: {e}")
        return PullError(f"{repo}: {what} failed: {type(e).__name__}: {short(e)}")

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
        # huggingface_hub's ref first; the GGUF cache keeps its own, which outlives a
        # snapshot deleted with --delete-snapshot
        for p in (self.storage / "refs" / self.revision, ref_path(self.repo, self.revision)):
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


def remove_snapshot(cache_dir: Path, repo: str, sha: str, say) -> None:
    """Remove revision `sha` from the HF cache (`pull --delete-snapshot`)."""
    from huggingface_hub import scan_cache_dir
    try:
        strategy = scan_cache_dir(cache_dir).delete_revisions(sha)
        strategy.execute()
        say(f"deleted the downloaded checkpoint ({strategy.expected_freed_size_str})")
    except Exception as e:  # noqa: BLE001 - the GGUF is done; a failed clean-up is only reported
        log.warning("could not delete the snapshot of %s@%s: %s", repo, sha[:12], e)


@contextlib.contextmanager
def progress_bars(enabled: bool):
    """huggingface_hub's progress bars off for the block unless `enabled` (then as they were)."""
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
