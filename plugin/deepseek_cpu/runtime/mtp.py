"""Multi-token prediction (MTP): DeepSeek's own draft head for speculative decoding.

DeepSeek-V3, R1, V3.1 and V3.2 ship one MTP ("nextn") block beside the main layers; our converter
keeps it (GGUF `blk.N.nextn.*`, N = the main layer count). For position p it reads the main model's
final hidden state h_p (after the output norm) and the embedding of token p+1, runs one decoder
layer of its own and predicts token p+2: a draft that the main model then verifies.

How it runs here, without a second copy of anything the main model keeps:
  - the main context hands out h for every token it computes (llama.cpp's `embeddings_nextn`,
    unmasked: all rows of a batch);
  - a second llama.cpp context of type MTP on the *same* model runs only the MTP block, so its
    KV cache is one layer: the pairs (h_{p-1}, token p) at position p, as the head was trained;
  - llama-cpp-python's speculative loop (Llama.generate with a draft model) evaluates the last
    sampled token and the drafts in one batch, samples every position from the main model's
    logits and keeps the drafts up to the first that differs. Every kept token is the main
    model's own sample, so greedy output is the same as without MTP and the sampling
    distribution is unchanged; MTP only changes how many tokens one decode step yields.

The pairs are written lazily, at the next draft, from the hidden states the main batches left:
pairs of a verify batch are written only once the sampler has said which drafts were kept, so
the MTP cache never holds a rejected token and needs no rollback. One MTP decode per step:
the kept drafts' pairs and the new draft's row go in one batch.

llama.cpp's MTP entry points are in its staging header (src/llama-ext.h, C++ linkage): they are
looked up by their mangled names in the pinned build (mtp_draft.NEXTN_SYMBOLS), the one place to
change when the pin moves.

This module is light (no llama_cpp: `serve` and the CLI read it); the drafter is mtp_draft.py.
"""
from __future__ import annotations

import sys

from ..errors import DeepseekCpuError

MAX_DRAFT = 3  # one trained head; chained further its drafts are rarely kept
# architectures whose llama.cpp graph has an MTP head the pinned engine can run
MTP_ARCHS = ("deepseek2", "deepseek32", "deepseek4")


class MtpUnavailable(DeepseekCpuError, ValueError):
    """The model cannot draft with MTP (no MTP block, or an architecture without the head)."""


def parse_draft(value) -> int:
    """`mtp` as users pass it: True/None-like -> 1 draft, False/0 -> off, 1..MAX_DRAFT."""
    if value is True:
        return 1
    if value in (False, None):
        return 0
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"mtp must be a number of draft tokens 0..{MAX_DRAFT} (got {value!r})") from None
    if not 0 <= n <= MAX_DRAFT:
        raise ValueError(f"mtp must be a number of draft tokens 0..{MAX_DRAFT} (got {n})")
    return n


def unavailable_reason(header) -> str | None:
    """Why this model cannot draft with MTP, or None if it can. `header`: the GGUF's metadata
    (gguf_header.read)."""
    arch = header.get("general.architecture") or ""
    n = int(header.get(f"{arch}.nextn_predict_layers") or 0)
    if n == 0:
        return ("the model has no MTP layer (convert the checkpoint with deepseek-cpu convert, "
                "which keeps it; --no-mtp or another converter leaves it out)")
    if arch not in MTP_ARCHS:
        return f"MTP drafting is not wired for architecture {arch} yet (only {', '.join(MTP_ARCHS)})"
    if n > 1:
        # llama.cpp's MTP graphs of these architectures assert on more (a process abort)
        return f"the model has {n} MTP layers ({arch}.nextn_predict_layers); llama.cpp's MTP head runs one"
    from .model_check import stripped_mtp_blocks
    stripped = stripped_mtp_blocks(header)
    if stripped:
        # the loader takes a block without tensors as optional (a file whose head was stripped,
        # key kept) and the MTP graph would then abort on its missing tensors
        return (f"{arch}.nextn_predict_layers = {n}, but the file has no tensors of its MTP layer "
                f"(blk.{stripped[0]}.*): the head was stripped from this file")
    if arch == "deepseek4":
        # llama.cpp's V4 MTP graph runs the head with sliding-window attention only, as DeepSeek's
        # V4-Flash config has it (compress ratio 0 for the MTP layer)
        ratios = header.array("deepseek4.attention.compress_ratios") or []
        main = int(header.get("deepseek4.block_count") or 0) - n
        mtp_ratios = list(ratios)[main:main + n]
        if any(int(r) != 0 for r in mtp_ratios):
            return (f"this V4 file's MTP layer uses compressed attention (compress ratio {mtp_ratios[0]}); "
                    "llama.cpp's V4 MTP head runs sliding-window attention only (ratio 0, as V4-Flash)")
    return None


class MtpStats:
    """Counters of one drafter: steps (drafts offered), drafted and kept tokens."""

    def __init__(self):
        self.steps = self.drafted = self.accepted = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens each verifying decode yields: the sampled one plus the kept drafts."""
        return (self.steps + self.accepted) / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        return {"steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": round(self.acceptance, 4), "tokens_per_step": round(self.tokens_per_step, 4)}


def warn(msg: str) -> None:
    print(f"deepseek-cpu: MTP off: {msg}", file=sys.stderr)


__all__ = ["MtpStats", "MtpUnavailable", "MAX_DRAFT", "parse_draft", "unavailable_reason"]
