"""The root of every error deepseek-cpu raises on purpose.

`except DeepseekCpuError` catches them all: the CLI turns one into a single
`Error: ...` line (cli.py), and callers wrapping the library need no list of classes
that must grow with each new error. Each subclass also keeps the standard-library
base that says what kind of failure it is (ConversionError is a ValueError,
MissingTokenizer a FileNotFoundError, ...), so `except ValueError` keeps working.

This module imports nothing: converters/tokenizer.py and converters/checkpoint.py,
which can be loaded as top-level modules of a source checkout, import it by its
absolute name (with a local stand-in when the package is not importable).
"""
from __future__ import annotations

__all__ = ["DeepseekCpuError"]


class DeepseekCpuError(Exception):
    """A failure deepseek-cpu detected; the message says what went wrong (and what to do)."""
