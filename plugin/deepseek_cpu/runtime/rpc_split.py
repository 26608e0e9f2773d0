"""Splitting a model's layers over this host and RPC workers, by the memory each offers."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .rpc_wire import RpcError

# what a worker needs beyond its layers' weights: the compute buffer (activations of one batch)
COMPUTE_RESERVE_MIN = 256 << 20
COMPUTE_RESERVE_FRACTION = 0.10


@dataclass
class Share:
    host: str                 # "local" or an endpoint
    offered: int              # bytes
    units: list[int] = field(default_factory=list)  # layer indices; n_layer is the output layer
    bytes: int = 0


OUTPUT_PATTERN = r"^output\.weight$"  # kept on this host: 20 KiB of hidden state cross the link, not the logits


@dataclass
class Split:
    n_layer: int
    local: Share      # its units: the first layers, if any, and always the output (n_layer)
    workers: list[Share]

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's count of layers placed on the devices: the output counts as one (its norm goes
        to the last worker; its weight is overridden to this host's CPU, OUTPUT_PATTERN)."""
        return self.n_layer + 1 - len([u for u in self.local.units if u < self.n_layer])

    @property
    def tensor_split(self) -> list[float]:
        counts = [float(len(w.units)) for w in self.workers]
        counts[-1] += 1  # llama.cpp's output "layer"
        return counts

    def describe(self) -> str:
        def rng(units):
            layers = [u for u in units if u < self.n_layer]
            text = f"layers {layers[0]}-{layers[-1]}" if layers else ""
            if self.n_layer in units:
                text = f"{text} + output" if text else "output"
            return text or "nothing"
        local = f"this host: {rng(self.local.units)} ({self.local.bytes / 2**30:.2f} GiB)"
        return "; ".join([local] + [f"{s.host}: {rng(s.units)} ({s.bytes / 2**30:.2f} of {s.offered / 2**30:.2f} GiB)"
                                    for s in self.workers])


def unit_sizes(model: str, kv_bytes_per_layer: int = 0, header=None) -> tuple[int, list[int]]:
    """(n_layer, bytes of each unit): the weights of layer i (plus its KV cache), then the output."""
    from ..gguf_header import read
    h = header or read(model)
    n_layer = int(h.get(f"{h.arch}.block_count") or 0)
    sizes = [kv_bytes_per_layer] * n_layer + [0]
    for t in h.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) < n_layer:
            sizes[int(m.group(1))] += t.nbytes
        elif t.name.startswith("output"):
            sizes[n_layer] += t.nbytes
    return n_layer, sizes


def usable(offered: int) -> int:
    """What of a worker's offer its layers may take: the rest is its compute buffer (a tenth, at
    least 256 MiB, but never more than half: a tiny model's compute buffer is tiny too)."""
    reserve = max(int(offered * COMPUTE_RESERVE_FRACTION), min(COMPUTE_RESERVE_MIN, offered // 2))
    return max(0, offered - reserve)


def plan_split(n_layer: int, sizes: list[int], local_offer: int, workers: list[tuple[str, int]]) -> Split:
    """Contiguous layers: the local host first (llama.cpp keeps the first layers on the CPU), then
    each worker in the order given, in proportion to what each offers, none past its offer. The
    output stays on the local host, beside the embeddings: sending the logits back would cost
    n_vocab floats per token (400 KiB for DeepSeek's vocabulary) instead of one hidden state."""
    output = sizes[n_layer]
    sizes = sizes[:n_layer]
    shares = [Share("local", local_offer)] + [Share(ep, off) for ep, off in workers]
    caps = [usable(s.offered) if s.host != "local" else s.offered for s in shares]
    total, cap_total = sum(sizes), sum(caps)
    if total > cap_total:
        raise RpcError(f"the model's layers need {total / 2**30:.2f} GiB; the hosts offer "
                       f"{cap_total / 2**30:.2f} GiB for layers (after each worker's compute buffer): "
                       f"add a worker or give more memory (--mem)")

    def assign(proportional: bool) -> bool:
        for s in shares:
            s.units, s.bytes = [], 0
        u, done, cum_cap = 0, 0, 0
        for k, s in enumerate(shares):
            cum_cap += caps[k]
            target = total * cum_cap / cap_total if proportional else float("inf")
            last = k == len(shares) - 1
            while u < len(sizes) and s.bytes + sizes[u] <= caps[k] and (last or done + sizes[u] / 2 <= target):
                s.units.append(u)
                s.bytes += sizes[u]
                done += sizes[u]
                u += 1
        return u == len(sizes)

    if not assign(True) and not assign(False):
        big = max(sizes)
        raise RpcError(f"the layers do not fit the hosts' offers one range each (largest layer "
                       f"{big / 2**30:.2f} GiB; offers {', '.join(f'{c / 2**30:.2f}' for c in caps)} GiB)")
    shares[0].units.append(n_layer)
    shares[0].bytes += output
    return Split(n_layer, shares[0], shares[1:])
