"""The MTP drafter: DeepSeek's multi-token-prediction head as a llama-cpp-python draft model
(what it is and how it runs: runtime/mtp.py)."""
from __future__ import annotations

import ctypes

import numpy as np

from llama_cpp import llama_cpp as C
from llama_cpp.llama_speculative import LlamaDraftModel

from .mtp import MtpStats, MtpUnavailable, unavailable_reason

CONTEXT_TYPE_MTP = 1  # enum llama_context_type: LLAMA_CONTEXT_TYPE_MTP
PROCESS_DECODE = 1  # enum llama_process_type: LLAMA_PROCESS_TYPE_DECODE

# llama-ext.h at the pinned llama.cpp (0c1e570), C++ linkage
NEXTN_SYMBOLS = {
    "set": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", None,
            (ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool)),
    "get": ("_Z26llama_get_embeddings_nextnP13llama_context", ctypes.POINTER(ctypes.c_float),
            (ctypes.c_void_p,)),
    "get_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", ctypes.POINTER(ctypes.c_float),
                (ctypes.c_void_p, ctypes.c_int)),
}


def _nextn_api():
    lib = C._lib
    api = {}
    for key, (name, res, args) in NEXTN_SYMBOLS.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise MtpUnavailable("this llama.cpp library has no MTP entry points (it is not the engine "
                                 "deepseek-cpu pins); MTP needs deepseek-cpu's own engine") from None
        f.restype, f.argtypes = res, list(args)
        api[key] = f
    return api


class MtpDraft(LlamaDraftModel):
    """The MTP head of `llm`'s model as a llama-cpp-python draft model (Llama(draft_model=...)).

    `llm` must have been loaded with the MTP layer (model params load_mtp) and evaluate through
    deepseek_cpu.Llama, whose eval() reports each main batch here (target_batch)."""

    def __init__(self, llm, n_draft: int = 1, header=None):
        """header: the model's GGUF header (gguf_header.read), if the caller has read it already."""
        if header is None:
            from ..gguf_header import read
            header = read(llm.model_path)
        reason = unavailable_reason(header)
        if reason:
            raise MtpUnavailable(reason)
        self.llm = llm
        self.n_draft = n_draft
        self.stats = MtpStats()
        self._api = _nextn_api()
        model = llm._model.model
        self.n_embd = C.llama_model_n_embd_out(model)  # V4: the hyper-connection streams, n_embd x hc
        self.n_vocab = llm.n_vocab()
        p = C.llama_context_default_params()
        p.ctx_type = CONTEXT_TYPE_MTP
        p.n_ctx = llm.n_ctx()
        p.n_batch = p.n_ubatch = llm.n_batch
        p.n_seq_max = 1
        p.n_threads = llm.context_params.n_threads
        p.n_threads_batch = llm.context_params.n_threads_batch
        # the head's attention as the main model's: its cache types and flash attention (llama.cpp's
        # default "auto" turns it on, which on CPU rounds through f16)
        p.type_k, p.type_v = llm.context_params.type_k, llm.context_params.type_v
        p.flash_attn_type = llm.context_params.flash_attn_type
        self.ctx = C.llama_init_from_model(model, p)
        if not self.ctx:
            raise MtpUnavailable("llama.cpp could not create the MTP context (see its log)")
        self.n_batch = C.llama_n_batch(self.ctx)
        self.batch = C.llama_batch_ext_init(self.ctx)
        self.mem = C.llama_get_memory(self.ctx)
        self._api["set"](llm._ctx.ctx, True, False)  # h of every token of every main batch
        self._api["set"](self.ctx, True, True)  # the head's own h, for chained drafts
        self.mtp_end = 0  # the MTP cache holds the pairs of positions [1, mtp_end)
        self.rows = np.zeros((0, self.n_embd), np.float32)  # main h of positions rows_pos0...
        self.rows_pos0 = 0
        self.expect = None  # (position, tokens) of the verify batch the last draft asks for
        self.last_draft = None  # (position of the first draft, number drafted)

    # --- main model side -------------------------------------------------------------------
    def is_verify(self, tokens, n_past: int) -> bool:
        """Whether eval(tokens) at n_past is the batch of the last draft (logits for every row)."""
        return self.expect is not None and self.expect[0] == n_past and list(tokens) == self.expect[1]

    def target_batch(self, n_past: int, n: int, verify: bool):
        """The main context decoded n tokens at positions n_past... (`verify`: the last draft's
        batch, whose tokens the sampler has yet to keep): keep their hidden states."""
        h = np.ctypeslib.as_array(self._api["get"](self.llm._ctx.ctx), shape=(n * self.n_embd,))
        h = h.reshape(n, self.n_embd)
        # the main cache went back (a new prompt, a prefix reused); a verify batch starts with the
        # token whose pair the draft wrote, and the sampler keeps it
        if n_past < self.mtp_end and not verify:
            C.llama_memory_seq_rm(self.mem, 0, n_past, -1)
            self.mtp_end = n_past
        end = self.rows_pos0 + len(self.rows)
        if end == n_past and len(self.rows):
            self.rows = np.concatenate([self.rows, h])
        else:
            self.rows, self.rows_pos0 = h.copy(), n_past
        if not verify:  # its tokens are final; drafts not settled were abandoned (a new prompt)
            self.last_draft = self.expect = None
            self._write_pairs(n_past + n - 1, None, output=False)

    # --- the head ---------------------------------------------------------------------------
    def _write_pairs(self, last: int, last_token, output: bool):
        """Write the pairs (h_{p-1}, token p) for p in [mtp_end, last] (token `last` is
        `last_token` when given, else the main model's input) in batches; with `output`, the
        last pair's logits are kept. An h this drafter no longer has (the main cache went back
        to a point inside an earlier batch) is zeros: llama.cpp wants a sequence's positions
        without gaps, and a pair off makes later drafts a little worse, never the output."""
        start = max(self.mtp_end, 1)
        if last < start:
            return
        ids = self.llm.input_ids
        r0, r1 = self.rows_pos0, self.rows_pos0 + len(self.rows)  # positions of the h we have
        for b0 in range(start, last + 1, self.n_batch):
            b1 = min(last, b0 + self.n_batch - 1)
            h = np.zeros((b1 - b0 + 1, self.n_embd), np.float32)  # row k: h of position b0 - 1 + k
            lo, hi = max(b0 - 1, r0), min(b1, r1)
            if lo < hi:
                h[lo - (b0 - 1):hi - (b0 - 1)] = self.rows[lo - r0:hi - r0]
            C.llama_batch_ext_clear(self.batch)
            for p in range(b0, b1 + 1):
                tok = int(last_token) if (p == last and last_token is not None) else int(ids[p])
                self._add(tok, p, h.ctypes.data + (p - b0) * h.strides[0], output and p == last)
            if C.llama_process(self.ctx, PROCESS_DECODE, self.batch) != 0:
                raise RuntimeError(f"MTP decode of positions {b0}..{b1} failed")
        self.mtp_end = last + 1
        keep = min(max(0, last - self.rows_pos0), len(self.rows))  # h_last onwards is still needed
        self.rows, self.rows_pos0 = self.rows[keep:], self.rows_pos0 + keep

    def _add(self, tok: int, pos: int, h_address: int, output: bool):
        """One row of an MTP batch; the batch only points at h: keep it alive until it is run."""
        i = C.llama_batch_ext_add_token(self.batch, 0, tok)
        if i < 0:
            raise RuntimeError(f"MTP batch refused token {tok} at {pos} ({i})")
        C.llama_batch_ext_set_pos(self.batch, i, ctypes.byref(ctypes.c_int32(pos)))
        h = ctypes.cast(h_address, ctypes.POINTER(ctypes.c_float))
        C.llama_batch_ext_set_embd_token(self.batch, i, C.llama_embd(h, 1, self.n_embd))
        C.llama_batch_ext_set_output_logits(self.batch, i, output)

    def _argmax(self) -> int:
        logits = np.ctypeslib.as_array(C.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def __call__(self, input_ids, /, **kwargs):
        """Drafts for the token after input_ids[-1] (just sampled, at position len - 1)."""
        llm = self.llm
        n_past = llm.n_tokens
        self._settle(n_past)
        self.expect = None
        if len(input_ids) != n_past + 1 or self.n_draft == 0:
            return np.zeros(0, np.intc)
        last = int(input_ids[-1])
        if n_past < self.mtp_end:
            C.llama_memory_seq_rm(self.mem, 0, n_past, -1)
            self.mtp_end = n_past
        self._write_pairs(n_past, last, output=True)
        drafts = [self._argmax()]
        pos = n_past
        while len(drafts) < self.n_draft and pos + len(drafts) < llm.n_ctx() - 1:
            # chained: the head's own output state stands in for the main model's
            h = np.ctypeslib.as_array(self._api["get_ith"](self.ctx, -1), shape=(self.n_embd,)).copy()
            C.llama_batch_ext_clear(self.batch)
            self._add(drafts[-1], pos + len(drafts), h.ctypes.data, True)
            if C.llama_process(self.ctx, PROCESS_DECODE, self.batch) != 0:
                raise RuntimeError("MTP decode failed")
            drafts.append(self._argmax())
        if len(drafts) > 1:  # the chained pairs are not the main model's: never kept
            C.llama_memory_seq_rm(self.mem, 0, pos + 1, -1)
        self.expect = (n_past, [last, *drafts])
        self.last_draft = (n_past + 1, len(drafts))
        return np.asarray(drafts, dtype=np.intc)

    def _settle(self, n_past: int):
        """Count what the sampler kept of the last drafts (the main cache now ends at n_past)."""
        if self.last_draft is not None:
            pos, n = self.last_draft
            self.stats.steps += 1
            self.stats.drafted += n
            self.stats.accepted += max(0, min(n, n_past - pos))
            self.last_draft = None

    def close(self):
        if getattr(self, "batch", None):
            C.llama_batch_ext_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            C.llama_free(self.ctx)
            self.ctx = None
