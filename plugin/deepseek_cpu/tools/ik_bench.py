"""ik_llama.cpp as an engine of `deepseek-cpu bench --compare-ik DIR`.

ik_llama.cpp is what people who run DeepSeek on CPUs use instead of stock llama.cpp, so it is the
peer our speed is judged against. We never build or ship it: the user points `--compare-ik` at the
bin/ directory of their own build and each of its runs is one `llama-bench` process, alternated
with ours like stock's runs.

What one run measures, mapped onto bench's metrics (ik's `llama-bench -o json`):
  pp_tok_s        `-p PP`       the prompt in one batch
  tg_tok_s        `-gp PP,TG`   TG tokens decoded after a PP-token prompt (ik times only the decode)
  tg_depth_tok_s  `-gp D,TG`    TG tokens decoded after a D-token prompt (--ctx-depth)
  peak_rss_bytes  the child's maximum resident set (wait4's rusage), like ours
Load time and time to first token are not in its output, so they stay empty for ik.

IK_DEFAULT_FLAGS are ik's best CPU settings for DeepSeek's MLA models (its README and
docs/benchmarks.md): weights repacked at load, fused MoE, MLA mode 3, flash attention.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

from ..errors import DeepseekCpuError

IK_BENCH = "llama-bench"
IK_DEFAULT_FLAGS = ("-rtr", "1", "-fmoe", "1", "-mla", "3", "-fa", "1")


class IkBenchNotFound(DeepseekCpuError, ValueError):
    """--compare-ik names a directory without an executable llama-bench (a usage error)."""


def ik_bench_path(bin_dir: str | os.PathLike) -> Path:
    """The llama-bench of an ik_llama.cpp build directory, or a clear error."""
    d = Path(bin_dir)
    for cand in (d / IK_BENCH, d / "bin" / IK_BENCH, d / "build" / "bin" / IK_BENCH):
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    raise IkBenchNotFound(f"--compare-ik {bin_dir}: no executable {IK_BENCH} there (give ik_llama.cpp's "
                          "build/bin directory)")


def parse_flags(flags: str | None) -> list[str]:
    return list(IK_DEFAULT_FLAGS) if flags is None else shlex.split(flags)


def command(exe: Path, spec: dict, flags: list[str]) -> list[str]:
    """The llama-bench command line for bench's spec (model, pp, tg, ctx_depth, threads)."""
    cmd = [str(exe), "-m", spec["model"], "-t", str(spec["threads"]), "-r", "1", "-o", "json",
           "-p", str(spec["pp"]), "-n", "0", "-gp", f"{spec['pp']},{spec['tg']}"]
    if spec.get("ctx_depth"):
        cmd += ["-gp", f"{spec['ctx_depth']},{spec['tg']}"]
    return cmd + flags


def parse_output(text: str, spec: dict) -> dict:
    """bench's metrics from llama-bench's JSON array of tests (ValueError if one is missing)."""
    tests = json.loads(text[text.index("["):text.rindex("]") + 1])
    out: dict = {}
    for t in tests:
        n_prompt, n_gen, ts = t.get("n_prompt"), t.get("n_gen"), t.get("avg_ts")
        if ts is None:
            continue
        if n_gen == 0 and n_prompt == spec["pp"]:
            out["pp_tok_s"] = float(ts)
        elif n_gen == spec["tg"] and n_prompt == spec["pp"]:
            out["tg_tok_s"] = float(ts)
        elif n_gen == spec["tg"] and spec.get("ctx_depth") and n_prompt == spec["ctx_depth"]:
            out["tg_depth_tok_s"] = float(ts)
        for k in ("build_commit", "cpu_info", "type_k", "mla_attn", "fused_moe", "repack"):
            if k in t and k not in out.get("ik_settings", {}):
                out.setdefault("ik_settings", {})[k] = t[k]
    wanted = ["pp_tok_s", "tg_tok_s"] + (["tg_depth_tok_s"] if spec.get("ctx_depth") else [])
    missing = [m for m in wanted if m not in out]
    if missing:
        raise ValueError(f"llama-bench's output lacks {', '.join(missing)}")
    return out


def run_once(exe: Path, spec: dict, flags: list[str], timeout: float, cgroup: str | None = None) -> dict:
    """One llama-bench process: bench's result dict (ok, metrics, peak_rss_bytes, wall_s)."""
    import tempfile
    cmd = command(exe, spec, flags)
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}

    def join():  # in the child, before exec: the memory limit holds from its first allocation
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, text=True, env=env,
                             preexec_fn=join if cgroup else None)
        # reaped here with wait4, which gives this child's own peak RSS (RUSAGE_CHILDREN would
        # be the largest of every child so far, ours included)
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t > timeout:
                p.kill()
                os.wait4(p.pid, 0)
                p.returncode = -9
                return {"ok": False, "error": f"timed out after {timeout:.0f} s", "command": cmd}
            time.sleep(0.05)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    res: dict = {"command": cmd, "wall_s": wall, "returncode": p.returncode}
    if p.returncode != 0:
        why = " (killed: out of memory?)" if p.returncode == -9 else ""
        return {**res, "ok": False, "error": f"llama-bench exited {p.returncode}{why}",
                "stderr_tail": err.strip().splitlines()[-15:]}
    try:
        res.update(parse_output(out, spec))
    except ValueError as e:
        return {**res, "ok": False, "error": f"llama-bench: {e}", "stderr_tail": err.strip().splitlines()[-15:]}
    res["ok"] = True
    res["peak_rss_bytes"] = usage.ru_maxrss * 1024
    return res
