"""cgroup v2 limits against a real v2 hierarchy (runtime/resources.py), not files that look like one.

A child process is moved into a v2 cgroup made for it and asked which cgroups, and how much memory,
our code finds. Where the system has no v2 hierarchy mounted, one is mounted for the test (as root
the v2 hierarchy can always be mounted beside v1's) and unmounted after.

- Finding the cgroup runs wherever there is root: the child's own v2 cgroup and its ancestors, also
  seen the way a container that shares the host's cgroup namespace sees it (its own cgroup mounted
  as the root of the hierarchy: Docker's --cgroupns=host, the default on v1 hosts).
  Checked against resources.py as it was before (paths fixed under /sys/fs/cgroup, no ancestors):
  both tests fail on it, and both fail when the v2 entry of /proc/self/cgroup is ignored.
- Reading the limit (memory.max, memory.current) needs the memory controller in the v2 hierarchy.
  Where cgroup v1 holds it (the kernel binds a controller to one hierarchy at a time, and moving it
  means taking v1's memory hierarchy down with every cgroup in it), the test says the runner lacks
  `cgroup2`; under CI that fails unless DEEPSEEK_CPU_RUNNER_LACKS declares it (tests/conftest.py).
  Its assertions were checked by hand against a v2 cgroup whose memory files were stand-ins (a
  tmpfs over the child's real v2 cgroup in its own mount namespace, which the child's code read
  through its real /proc/self/cgroup): they fail when memory.max is ignored, when memory.current is
  ignored, and when an ancestor's limit is (only the child's own cgroup read).
- The same two rules (an ancestor's limit, a container's view) run with a real limit on v1, where
  runners that lack `cgroup2` have the memory controller; resources.py as it was fails both, and
  one that left memory.usage_in_bytes out fails both.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import runner_lacks
from deepseek_cpu.runtime.model_file import ModelShape, default_n_ctx
from deepseek_cpu.runtime.resources import available_memory

# a model shape whose default context the memory limit decides: (available - 64 MiB) / 4 / 16 KiB
# tokens, in 256s, at most 32768 (runtime/model_file.py's default_n_ctx)
SHAPE_FILE, SHAPE_KV = 64 << 20, 16 << 10
# what a child reports: the cgroup directories resources.py finds (by inode, comparable across
# mount namespaces and mounts of the one v2 hierarchy), the room under their limits and what the
# engine would plan from it
REPORT = f"""
import json, os
from deepseek_cpu.runtime import resources as r
from deepseek_cpu.runtime.model_file import ModelShape, default_n_ctx
ids = lambda p: (os.stat(p).st_dev, os.stat(p).st_ino) if os.path.isdir(p) else (None, None)
found = [(v, str(p), *ids(p)) for v, p in r._own_cgroups("memory") if v == 2]
shape = ModelShape("deepseek2", 1, 1 << 20, {SHAPE_KV}, {SHAPE_FILE})
print(json.dumps({{"found": found, "room": r._cgroup_memory_room(), "available": r.available_memory(),
                   "n_ctx": default_n_ctx(shape)}}))
"""


def _v2_mount() -> Path | None:
    """Where this process sees the whole v2 hierarchy mounted (mount root "/"), if anywhere."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields = pre.split()
        if post.split()[:1] == ["cgroup2"] and fields[3] == "/":
            return Path(fields[4].replace("\\040", " "))
    return None


@pytest.fixture(scope="module")
def v2_root():
    """The root of the cgroup v2 hierarchy: the system's mount, else one mounted for these tests."""
    if os.geteuid() != 0:
        runner_lacks("root", f"uid {os.geteuid()}: cgroups")
    found = _v2_mount()
    if found is not None:
        yield found
        return
    where = Path(tempfile.mkdtemp(prefix="dsc-cgroup2-"))
    r = subprocess.run(["mount", "-t", "cgroup2", "none", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        where.rmdir()
        runner_lacks("cgroup2", f"mount -t cgroup2: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
        where.rmdir()


def _remove(group: Path) -> None:
    """rmdir a cgroup: its last process may still be leaving; one left behind is killed."""
    for attempt in range(100):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if attempt == 50 and (group / "cgroup.kill").exists():
                (group / "cgroup.kill").write_text("1")
            time.sleep(0.1)
    raise RuntimeError(f"could not remove the test's cgroup {group}")


@contextlib.contextmanager
def v2_groups(root: Path, *paths: str, memory: bool = False):
    """Make cgroups under `root` (paths relative to it, parents first) and remove them after, also on
    failure; with memory=True the memory controller is enabled for every one of them that has a
    child (and at the root, put back as it was)."""
    made: list[Path] = []
    enabled_at_root = False
    try:
        if memory:
            enabled_at_root = "memory" not in (root / "cgroup.subtree_control").read_text().split()
            if enabled_at_root:
                try:
                    (root / "cgroup.subtree_control").write_text("+memory")
                except OSError as e:  # a container's root that holds processes itself (EBUSY)
                    enabled_at_root = False
                    runner_lacks("cgroup2", f"cannot enable memory in {root / 'cgroup.subtree_control'}: {e}")
        for rel in paths:
            group = root / rel
            group.mkdir()
            made.append(group)
            if memory and group.parent != root:
                # a cgroup's controllers come from its parent's subtree_control
                control = group.parent / "cgroup.subtree_control"
                if "memory" not in control.read_text().split():
                    control.write_text("+memory")
        yield [root / rel for rel in paths]
    finally:
        for group in reversed(made):
            _remove(group)
        if enabled_at_root:
            with contextlib.suppress(OSError):  # something else started using it meanwhile
                (root / "cgroup.subtree_control").write_text("-memory")


def _report(group: Path, *wrap: str) -> dict:
    """REPORT from a child started in `group` (through the command `wrap`, if any)."""
    out = subprocess.run([*wrap, sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ids(*dirs: Path) -> list[list[int]]:
    return [[os.stat(d).st_dev, os.stat(d).st_ino] for d in dirs]


def test_a_process_finds_its_v2_cgroup_and_the_ones_above_it(v2_root):
    top = f"dsc-test-{os.getpid()}"
    with v2_groups(v2_root, top, f"{top}/leaf") as (outer, leaf):
        report, ids = _report(leaf), _ids(leaf, outer, v2_root)
    # leaf, then its ancestors up to the hierarchy's root: an ancestor's limit binds the leaf too
    assert [f[2:] for f in report["found"]] == ids, report["found"]


def test_a_container_sharing_the_hosts_cgroup_namespace_finds_its_cgroup(v2_root):
    """The child's own cgroup mounted over the hierarchy's mount point, in a mount namespace of its
    own: /proc/self/cgroup still names the host's path, which does not exist under that mount."""
    top = f"dsc-test-{os.getpid()}"
    with v2_groups(v2_root, top) as (group,):
        inside = f"mount --bind {group} {v2_root} && exec \"$@\""
        report = _report(group, "unshare", "--mount", "--propagation", "private", "sh", "-c", inside, "sh")
        ids = _ids(group)
    assert [f[2:] for f in report["found"]] == ids, report["found"]
    assert report["found"][0][1] == str(v2_root)


@pytest.fixture(scope="module")
def v2_memory(v2_root):
    """The v2 root, where the memory controller is in the v2 hierarchy."""
    offered = (v2_root / "cgroup.controllers").read_text().split()
    if "memory" not in offered:
        # /proc/cgroups: subsys_name hierarchy num_cgroups enabled; a v1 hierarchy holds it if not 0
        row = next((l.split() for l in Path("/proc/cgroups").read_text().splitlines()
                    if l.split()[:1] == ["memory"]), None)
        why = ("this kernel has no memory controller" if row is None or row[3] == "0" else
               f"cgroup v1 holds it (hierarchy {row[1]} in /proc/cgroups)" if row[1] != "0" else "v2 does not offer it")
        runner_lacks("cgroup2", f"the memory controller is not in {v2_root / 'cgroup.controllers'} "
                                f"({' '.join(offered) or 'none'}): {why}")
    return v2_root


LIMIT = 384 << 20


@pytest.mark.parametrize("where", ["own", "ancestor"])
def test_memory_max_bounds_the_memory_we_plan_for(v2_memory, where):
    """memory.max on the child's own cgroup, or on a parent with the child's own left at "max"
    (a systemd slice's MemoryMax over a scope), bounds what it reports it can allocate, and so the
    default context; the room is the limit less what the cgroup already uses."""
    free = available_memory()
    assert free > 4 * LIMIT, f"this machine has {free} bytes free: a {LIMIT}-byte limit would prove little"
    top = f"dsc-test-{os.getpid()}"
    with v2_groups(v2_memory, top, f"{top}/slice", f"{top}/slice/scope", memory=True) as (_, parent, leaf):
        (parent if where == "ancestor" else leaf).joinpath("memory.max").write_text(str(LIMIT))
        assert (leaf / "memory.max").read_text().strip() == ("max" if where == "ancestor" else str(LIMIT))
        report = _report(leaf)
    check_memory_report(report, free)


def check_memory_report(report: dict, free: int) -> None:
    """What a child under a LIMIT-byte memory limit (its own cgroup's or an ancestor's) must report."""
    room = report["room"]
    assert room is not None, "the limit was not found"
    # the child is charged for itself (interpreter, numpy, gguf): some MiB, far from the limit
    assert 0 < room < LIMIT and LIMIT - room < LIMIT // 2, room
    assert 0 < report["available"] <= LIMIT, report
    shape = ModelShape("deepseek2", 1, 1 << 20, SHAPE_KV, SHAPE_FILE)
    assert report["n_ctx"] <= (LIMIT - SHAPE_FILE) // 4 // SHAPE_KV < default_n_ctx(shape, free), report


V1_MEMORY = Path("/sys/fs/cgroup/memory")


@pytest.mark.parametrize("where", ["ancestor", "container view"])
def test_the_same_rules_on_v1_with_a_real_limit(where):
    """Where v1 holds the memory controller (as on runners that lack `cgroup2`) the same two rules
    run against a real limit: a parent's limit over the child's unlimited cgroup, and the child's
    limited cgroup mounted as the hierarchy's root in a mount namespace of its own (a container
    sharing the host's cgroup namespace, Docker's default on v1 hosts). resources.py as it was
    found no limit in either."""
    if os.geteuid() != 0:
        runner_lacks("root", f"uid {os.geteuid()}: memory cgroups")
    if not (V1_MEMORY / "cgroup.procs").exists():
        runner_lacks("cgroup1", f"no {V1_MEMORY / 'cgroup.procs'}")
    free = available_memory()
    assert free > 4 * LIMIT, f"this machine has {free} bytes free: a {LIMIT}-byte limit would prove little"
    top = V1_MEMORY / f"dsc-test-{os.getpid()}"
    made = []
    try:
        for group in (top, top / "inner"):
            group.mkdir()
            made.append(group)
        (top / "memory.limit_in_bytes").write_text(str(LIMIT))
        if where == "ancestor":
            report = _report(top / "inner")
        else:
            inside = f"mount --bind {top} {V1_MEMORY} && exec \"$@\""
            report = _report(top, "unshare", "--mount", "--propagation", "private", "sh", "-c", inside, "sh")
    finally:
        for group in reversed(made):
            _remove(group)
    check_memory_report(report, free)
