"""A memory budget: run a model larger than the memory it is given.

By default the engine copies (repacks) every weight into anonymous memory at load: fastest when the
model fits, an out-of-memory kill when a container's limit is below the file size. Under a budget
(`Llama(..., mem_budget="4G")`, `run/serve/bench --mem-budget 4G`) the routed experts (the
`ffn_{gate,up,down}_exps` tensors, ~90% of a DeepSeek MoE's bytes; each token uses 6 of 64 or
160) stay in the file mapping and run on the engine's kernels for plain weights; the kernel keeps
the pages that are used in its page cache, as many as the limit allows, and drops the rest
instead of killing the process. What every token reads (attention, norms, router, shared
experts, dense layers, embeddings, output: the always-hot set) is copied and repacked as usual;
with the KV cache it must fit the budget. The experts share what is left, and a prefetch policy
(runtime/prefetch.py) decides which of them to read ahead.

The budget is a plan, not a limit: the engine allocates no more than the hot set, and the page
cache fills what the kernel (or a memory cgroup) allows. Enforce a hard limit with the container's
memory limit; a budget that matches it makes the model run there instead of being killed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import DeepseekCpuError
from . import resources

# the routed experts' stacked tensors; kept file-backed under a budget
EXPERT_TENSORS = re.compile(r"\.ffn_(gate|up|down)_exps\.weight$")
# the engine's switch: tensors whose name matches this regular expression stay in the file mapping
# (read here for llama-server's environment; runtime/model_params.py sets it for one load)
MAPPED_ENV = "DEEPSEEK_CPU_MAPPED"
# the engine's read-ahead under a budget (dsc/expert-prefetch.c): 1 = each layer's chosen experts as
# soon as its router chose. Level 2 adds the next layer's predicted ones (pre-gating): on V2-Lite
# Q4_0 under a memory limit it predicted 80% of the experts, but the other 20% cost more disk reads
# than the head start gained (decode 0.81-0.90x of level 1; docs/benchmarks.md), so it is opt-in.
EXPERT_PREFETCH_LEVEL = 1


class MemoryBudgetError(DeepseekCpuError):
    """A budget that cannot hold the always-hot set, or that cannot be read."""


def parse_size(text: str | int) -> int:
    """A memory budget: '4G', '512M', '4.5GiB', '4096' (bytes) -> bytes; a MemoryBudgetError if not."""
    return resources.parse_size(text, "memory budget", MemoryBudgetError)


def format_size(n: int | float) -> str:
    """Bytes in the largest binary unit that keeps them above 1 (GiB, MiB, KiB), for messages: a
    tiny model's 3 MiB must not read "0.00 GiB" (the one size formatter of the runtime's messages)."""
    for unit, scale, digits in (("GiB", 2**30, 2), ("MiB", 2**20, 1), ("KiB", 2**10, 1)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} bytes"


@dataclass
class BudgetPlan:
    budget: int
    hot_weights: int    # bytes of the tensors every token uses
    expert_weights: int  # bytes of the routed experts
    kv_cache: int       # bytes of the KV cache at the planned n_ctx
    experts_per_token: int = 0  # routed experts each token uses (the GGUF's expert_used_count)

    @property
    def hot(self) -> int:
        return self.hot_weights + self.kv_cache

    @property
    def expert_cache(self) -> int:
        """What the page cache can hold of the experts within the budget."""
        return max(0, self.budget - self.hot)

    def describe(self) -> str:
        share = min(1.0, self.expert_cache / self.expert_weights) if self.expert_weights else 1.0
        size = format_size
        return (f"memory budget {size(self.budget)}: always-hot {size(self.hot)} (weights {size(self.hot_weights)}, "
                f"KV cache {size(self.kv_cache)}), routed experts {size(self.expert_weights)}, "
                f"{share:.0%} of them fit the page cache")


def read_header(model_path: str | Path):
    """The GGUF's header, or a MemoryBudgetError saying the file cannot be planned for."""
    from ..gguf_header import read
    try:
        return read(model_path)
    except (OSError, ValueError) as e:
        raise MemoryBudgetError(f"{model_path}: not a readable GGUF ({e})") from None


def tensor_bytes(model_path: str | Path, header=None) -> tuple[int, int]:
    """(always-hot bytes, routed-expert bytes) of a GGUF's tensors."""
    hot = experts = 0
    for t in (header or read_header(model_path)).tensors:
        if EXPERT_TENSORS.search(t.name):
            experts += t.nbytes
        else:
            hot += t.nbytes
    return hot, experts


def plan(model_path: str | Path, budget: int, kv_cache: int, header=None) -> BudgetPlan:
    """Check that `budget` holds the always-hot set; raises MemoryBudgetError naming both sizes."""
    import gguf
    h = header or read_header(model_path)
    hot, experts = tensor_bytes(model_path, h)
    k = h.get(gguf.Keys.LLM.EXPERT_USED_COUNT.format(arch=h.arch), 0)
    p = BudgetPlan(budget, hot, experts, kv_cache, int(k) if isinstance(k, int) else 0)
    if p.hot > budget:
        size = format_size
        raise MemoryBudgetError(
            f"memory budget {size(budget)} is smaller than the always-hot set of {model_path}: {size(p.hot)} "
            f"(attention, shared experts, dense layers, embeddings and output {size(hot)}, KV cache {size(kv_cache)}); "
            f"give at least {size(p.hot)}, or a smaller n_ctx")
    return p


def server_env() -> dict[str, str]:
    """The same placement for llama-server: the routed experts stay in the file mapping, the rest
    placed as usual (runtime/model_params.py)."""
    return {MAPPED_ENV: EXPERT_TENSORS.pattern}
