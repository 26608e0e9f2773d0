"""llama_cpp on our patched engine, with a llama.cpp log callback that never raises.

Importing this module points llama-cpp-python at our libllama (the drop-in, in case the
.pth start-up hook did not run), imports llama_cpp and installs `safe_log_callback` as the
process-wide llama.cpp/ggml log callback. It is what llama.py (the `Llama` class) and the
hub's quantizer (hub/conversion.py) both need before they call llama.cpp; kept apart from
llama.py so the hub can have it without importing llama.py.

llama-cpp-python's callback does `text.decode("utf-8")` on every chunk: a chunk holding
part of a multi-byte character raises inside a ctypes callback, which prints a traceback
("Exception ignored on calling ctypes callback function") and drops the line. Ours
decodes incrementally (a character split across chunks is joined; invalid bytes become
U+FFFD) and never raises. Which lines are shown is unchanged: llama-cpp-python's level
table and its "llama-cpp-python" logger (set by `verbose=`) decide, as before. It writes
to sys.stderr as it is at each call, so contextlib.redirect_stderr captures llama.cpp's log.
"""
from __future__ import annotations

import codecs
import ctypes
import sys

from .. import _dropin

_dropin.activate()

import llama_cpp  # noqa: E402  (after the drop-in has chosen the library)
import llama_cpp._logger as _lc_logger  # noqa: E402

_log_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
_log_last_level = 0


def _log_write(level: int, text: bytes | None) -> None:
    global _log_last_level
    table = _lc_logger.GGML_LOG_LEVEL_TO_LOGGING_LEVEL
    # level 5 (GGML_LOG_LEVEL_CONT) continues the previous line: it keeps that line's level
    py_level = table.get(_log_last_level if level == 5 else level, table[0])
    if level != 5:
        _log_last_level = level
    if _lc_logger.logger.level <= py_level:
        s = _log_decoder.decode(text or b"")
        if s:
            sys.stderr.write(s)
            sys.stderr.flush()


@llama_cpp.llama_log_callback
def safe_log_callback(level, text, user_data):
    try:
        _log_write(level, text)
    except Exception:  # a log line must never raise into C
        pass


def install_log_callback() -> None:
    """Make `safe_log_callback` the process-wide llama.cpp/ggml log callback."""
    llama_cpp.llama_log_set(safe_log_callback, ctypes.c_void_p(0))
    _lc_logger.llama_log_callback = safe_log_callback  # keep llama_cpp's own name pointing at it


install_log_callback()
