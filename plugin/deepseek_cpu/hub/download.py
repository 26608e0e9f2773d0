"""Resumable downloads into the Hugging Face cache, across processes.

huggingface_hub (2.x) downloads each file to a process-unique temporary and deletes it on
failure, so a pull that is killed (OOM killer, Ctrl-C twice, a reboot) halfway through a
5 GB shard starts that shard again from zero. Here each blob is downloaded to a stable
name, `blobs/<etag>.dscpu-partial`, next to where huggingface_hub puts the finished blob;
a later run (any process) continues it with an HTTP Range request, under the same
per-blob lock huggingface_hub takes. The finished file is checked against its size and,
for LFS files, its sha256, then renamed to `blobs/<etag>`; `snapshot_download` afterwards
only links it into the snapshot. (The hub answers an LFS file with a 302 to a signed CDN
URL carrying `X-Linked-Etag: "<sha256>"` and `X-Linked-Size`, which `get_hf_file_metadata`
reports as the etag and size; the CDN's own ETag is not the sha256. A plain git file's
ETag is its git blob sha1, and is not checked here.)

Only public huggingface_hub functions are used (`get_hf_file_metadata`, `http_get`), so
HF_ENDPOINT, tokens, proxies and its own in-run retries behave as they do there.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from urllib.parse import urlparse

from ..errors import DeepseekCpuError

log = logging.getLogger("deepseek_cpu.hub.download")

PARTIAL_SUFFIX = ".dscpu-partial"


class ChecksumError(DeepseekCpuError, OSError):
    """The downloaded bytes do not hash to the file's sha256 (the partial file is removed)."""


class _HashingWriter:
    """A binary file that hashes what is written; `http_get` may rewind it to 0 and truncate
    (when a server ignores the Range header), which restarts the hash."""

    def __init__(self, f, hasher_factory):
        self._f, self._new = f, hasher_factory
        self._rehash()
        self._f.seek(0, os.SEEK_END)

    def _rehash(self) -> None:
        """Hash what the file holds now (the kept part on resume; nothing after a restart)."""
        pos = self._f.tell()
        self.hasher = self._new()
        self._f.seek(0)
        while chunk := self._f.read(1 << 24):
            self.hasher.update(chunk)
        self._f.seek(pos)

    def write(self, b) -> int:
        n = self._f.write(b)
        self.hasher.update(b)
        # a killed process keeps what it had received: nothing waits in a user-space buffer
        self._f.flush()
        return n

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def truncate(self, size: int | None = None) -> int:
        n = self._f.truncate(size)
        self._rehash()
        return n


def _lfs_sha256(etag: str) -> str | None:
    return etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None


def ensure_blob(repo: str, filename: str, sha: str, *, storage: Path, locks: Path, endpoint: str,
                token) -> Path:
    """Make sure `storage/blobs/<etag>` holds `filename` of `repo`@`sha`, continuing a partial
    download left by an earlier process. Returns the blob path."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    url = hf_hub_url(repo, filename, revision=sha, endpoint=endpoint)
    meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    if not meta.etag:
        raise OSError(f"{filename}: the hub sent no ETag; cannot cache it safely")
    blob = storage / "blobs" / meta.etag
    if blob.exists():
        return blob
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = locks / f"{meta.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    headers = build_hf_headers(token=token)
    target = meta.location or url
    if urlparse(target).netloc != urlparse(url).netloc:
        headers.pop("authorization", None)  # a signed CDN url: never forward the token
    want_sha = _lfs_sha256(meta.etag)
    partial = blob.with_name(meta.etag + PARTIAL_SUFFIX)

    with WeakFileLock(str(lock)):
        if blob.exists():  # another process finished it while we waited
            return blob
        with open(partial, "ab+") as raw:
            have = raw.seek(0, os.SEEK_END)
            if meta.size is not None and have > meta.size:
                raw.truncate(0)
                have = 0
            if have:
                log.info("%s: resuming at %.1f of %.1f MiB", filename, have / 2**20, (meta.size or 0) / 2**20)
            out = _HashingWriter(raw, hashlib.sha256)
            if meta.size is None or have < meta.size:
                http_get(target, out, resume_size=have, headers=headers, expected_size=meta.size,
                         displayed_filename=filename)
            size = raw.seek(0, os.SEEK_END)
            digest = out.hasher.hexdigest()
            raw.flush()
            os.fsync(raw.fileno())
        if meta.size is not None and size != meta.size:
            raise OSError(f"{filename}: got {size} bytes, the hub says {meta.size}; run the pull again")
        if want_sha and digest != want_sha:
            partial.unlink(missing_ok=True)
            raise ChecksumError(f"{filename}: sha256 {digest[:12]}… does not match the hub's {want_sha[:12]}…; "
                                "the partial download was removed")
        _set_mode(partial)
        os.replace(partial, blob)
    return blob


def _set_mode(path: Path) -> None:
    # what huggingface_hub gives its blobs: 0o666 minus the umask
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
