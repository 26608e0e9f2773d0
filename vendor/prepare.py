"""Fetch, verify, unpack and patch the pinned llama.cpp source.

Called by CMakeLists.txt at configure time (and usable by hand):

    python vendor/prepare.py --dest BUILD/llama.cpp

Source of the tarball, first match wins:
  1. DEEPSEEK_CPU_SDIST=/path/to/llama_cpp_python-0.3.36.tar.gz (offline builds)
  2. the cache, sdist/ under $DEEPSEEK_CPU_CACHE (default ~/.cache/deepseek-cpu)
  3. `python -m pip download` from the package index, then stored in the cache

The tarball's sha256 must match vendor/pin.toml. The patched tree is rebuilt only
when the tarball or a patch changes (stamp file), so rebuilds stay incremental.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class PrepareError(RuntimeError):
    """Preparing the llama.cpp tree failed. Deliberately outside deepseek_cpu.errors'
    hierarchy: CMake runs this file before the package exists (no deepseek_cpu to import);
    stock.py, the package's one caller, re-raises it as StockBuildError."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir() -> Path:
    # The cache root is deepseek_cpu.cache.cache_root(); this file runs at build time, before
    # the package exists (nothing to import), so it keeps its own copy of the rule: keep the
    # two in step (tests/test_pull.py checks they agree).
    if os.environ.get("DEEPSEEK_CPU_CACHE"):
        base = Path(os.path.expanduser(os.environ["DEEPSEEK_CPU_CACHE"]))
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = Path(xdg) / "deepseek-cpu"
    return base / "sdist"


def verify(path: Path, pin: dict, origin: str) -> None:
    got = sha256_of(path)
    if got != pin["sha256"]:
        raise PrepareError(
            f"sha256 mismatch for {origin} {path}:\n  expected {pin['sha256']}\n  got      {got}\n"
            "The file is corrupt, truncated or not the pinned release; delete it and build again."
        )


def download(pin: dict, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        # --no-binary for this package only: applied to everything it would also
        # force the build requirements (cmake, ...) to compile from source.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
               "--no-binary", pin["name"], f"{pin['name']}=={pin['version']}", "-d", tmp]
        print("deepseek-cpu: fetching", pin["filename"], "through pip", flush=True)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = Path(tmp) / pin["filename"]
        if r.returncode != 0 or not got.exists():
            raise PrepareError(f"could not fetch {pin['filename']} with pip (exit {r.returncode}):\n{r.stdout[-3000:]}\n"
                               "For offline builds set DEEPSEEK_CPU_SDIST to a local copy of the tarball.")
        verify(got, pin, "downloaded")
        final = dest / pin["filename"]
        os.replace(got, final)
    return final


def locate_sdist(pin: dict) -> Path:
    local = os.environ.get("DEEPSEEK_CPU_SDIST")
    if local:
        p = Path(local)
        if not p.is_file():
            raise PrepareError(f"DEEPSEEK_CPU_SDIST={local} is not a file")
        verify(p, pin, "DEEPSEEK_CPU_SDIST")
        return p
    cached = cache_dir() / pin["filename"]
    if cached.exists():
        try:
            verify(cached, pin, "cached")
            return cached
        except PrepareError as e:
            print(f"deepseek-cpu: {e}\ndeepseek-cpu: discarding the cached copy", file=sys.stderr)
            cached.unlink()
    return download(pin, cache_dir())


def own_files(patches: Path) -> list[Path]:
    """Our own source files (kernels, headers, test programs), kept as plain files under
    patches/files/ at the path they take in the llama.cpp tree; the series only hooks them in."""
    root = patches / "files"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def add_own_files(tree: Path, files: list[Path], patches: Path) -> None:
    root = patches / "files"
    for src in files:
        rel = src.relative_to(root)
        dst = tree / rel
        if dst.exists():
            # a newer llama.cpp now has a file of that name: rename ours rather than overwrite
            raise PrepareError(f"patches/files/{rel} would replace a file of the pinned source")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        print(f"deepseek-cpu: added {rel}", flush=True)


def read_series(patches: Path) -> list[str]:
    """The series' patch names in order: paths under patches/ (fixes/x.patch; the folder is
    the patch's group)."""
    lines = (patches / "series").read_text().splitlines()
    return [l.strip() for l in lines if l.strip() and not l.startswith("#")]


def series_sha256(patches: Path | None, names: list[str], files: list[Path]) -> str:
    """One name for the exact change set: sha256 of the patches' bytes in series order, then
    of each own file's path under patches/files and its bytes (the build marker carries the
    first 12 hex digits instead of every patch's name)."""
    h = hashlib.sha256()
    for n in names:
        if (patches / n).exists():
            h.update((patches / n).read_bytes())
    for f in files:
        h.update(f.relative_to(patches / "files").as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def apply_patches(tree: Path, patches: Path, names: list[str]) -> None:
    for n in names:
        p = patches / n
        if not p.exists():
            raise PrepareError(f"patches/series names {n}, which does not exist")
        base = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-d", str(tree), "-i", str(p)]
        dry = subprocess.run(base + ["--dry-run"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if dry.returncode != 0:
            raise PrepareError(f"patch {n} does not apply to the pinned source:\n{dry.stdout}")
        subprocess.run(base + ["--quiet"], check=True)
        print(f"deepseek-cpu: applied {n}", flush=True)


def load_pin() -> dict:
    return tomllib.loads((HERE / "pin.toml").read_text())["sdist"]


def sync_tree(src: Path, dest: Path) -> None:
    """Make `dest` equal to `src`, touching only files whose content changed, so that
    a new patch rebuilds what it changes instead of the whole tree."""
    seen = set()
    for root, _dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for f in files:
            s, d = Path(root) / f, dest / rel / f
            seen.add(rel / f)
            if not d.exists() or d.stat().st_size != s.stat().st_size or d.read_bytes() != s.read_bytes():
                os.replace(s, d)
    for root, _dirs, files in os.walk(dest):
        rel = Path(root).relative_to(dest)
        for f in files:
            if rel / f not in seen:
                (Path(root) / f).unlink()


def prepare(dest: Path, patches: Path | None = ROOT / "patches", pin: dict | None = None) -> dict:
    """Unpack the pinned source into `dest` and apply the series in `patches`;
    patches=None gives the stock tree (no patches), e.g. for `bench --compare-stock`."""
    pin = pin or load_pin()
    names = read_series(patches) if patches is not None else []
    files = own_files(patches) if patches is not None else []
    sdist = locate_sdist(pin)
    stamp_data = {"sha256": pin["sha256"], "patches": {n: sha256_of(patches / n) for n in names if (patches / n).exists()},
                  "files": {str(f.relative_to(patches)): sha256_of(f) for f in files}}
    stamp = dest / ".deepseek-cpu-stamp.json"
    info = {"commit": pin["llama_cpp_commit"], "version": pin["version"], "patches": names,
            "series_sha256": series_sha256(patches, names, files)}
    if stamp.exists() and json.loads(stamp.read_text()) == stamp_data:
        return info
    tmp = Path(tempfile.mkdtemp(prefix=".prepare-", dir=dest.parent))
    try:
        try:
            with tarfile.open(sdist) as tf:
                prefix = pin["llama_cpp_dir"].rstrip("/") + "/"
                members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
                if not members:
                    raise PrepareError(f"{sdist} has no {prefix} directory")
                tf.extractall(tmp, members=members, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            raise PrepareError(f"cannot unpack {sdist}: {e}") from e
        tree = tmp / pin["llama_cpp_dir"]
        # the submodule pointer would make llama.cpp's build look for a parent git repo
        (tree / ".git").unlink(missing_ok=True)
        apply_patches(tree, patches, names)
        if patches is not None:
            add_own_files(tree, files, patches)
        (tree / ".deepseek-cpu-stamp.json").write_text(json.dumps(stamp_data))
        if dest.exists():
            sync_tree(tree, dest)
        else:
            os.replace(tree, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, required=True, help="directory for the patched llama.cpp tree")
    ap.add_argument("--patches", type=Path, default=ROOT / "patches")
    ap.add_argument("--no-patches", action="store_true", help="unpack the stock source, applying no patch")
    ap.add_argument("--info", type=Path, help="write commit/version/patch list as JSON here")
    a = ap.parse_args()
    a.dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = prepare(a.dest.resolve(), None if a.no_patches else a.patches)
    except PrepareError as e:
        print(f"deepseek-cpu: error: {e}", file=sys.stderr)
        return 1
    if a.info:
        a.info.write_text(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
