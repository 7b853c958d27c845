"""Text that came from a checkpoint, made safe to store and to show.

A file name is whatever bytes its writer chose. Two things go wrong if drill passes it on as
it is:

- **storing**: a name that is not UTF-8 reaches Python as lone surrogates (``\\udcff``,
  PEP 383), which neither SQLite, PostgreSQL nor strict JSON can encode, so a verdict naming
  it could never be recorded. :func:`lossless` writes each undecodable byte as ``\\xNN``
  instead — the same bytes can be read back from the record.
- **showing**: ``ESC [ …`` sequences, carriage returns and bidirectional overrides in a name
  would move the cursor, recolour or rewrite the operator's terminal, and a newline would
  start a line of its own (a forged ``step-999 passed``). :func:`printable` shows every
  control character — newline and tab included — as an escape (``\\x1b``, ``\\n``): a name,
  a message, a cell is one line, whatever it holds. What is meant to be several lines (a
  traceback) is shown a line at a time.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")
"""C0 and C1 controls (newline and tab too), DEL, the line and paragraph separators, and the
bidirectional formatting marks."""


def lossless(text: str) -> str:
    """``text`` encodable as UTF-8 everywhere: undecodable bytes (surrogate escapes) as ``\\xNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub(_surrogate, text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` safe for a terminal, on one line: control characters (newlines and tabs
    included) and bidi marks shown as escapes."""
    return _CONTROL.sub(_escape, lossless(text))


__all__ = ["lossless", "printable"]
