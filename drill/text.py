"""Text that came from a checkpoint, made safe to store and to show.

A file name is whatever bytes its writer chose. Two things go wrong if drill passes it on as
it is:

- **storing**: a name that is not UTF-8 reaches Python as lone surrogates (``\\udcff``,
  PEP 383), which neither SQLite, PostgreSQL nor strict JSON can encode, so a verdict naming
  it could never be recorded. :func:`lossless` writes each undecodable byte as ``\\xNN``
  instead — the same bytes can be read back from the record.
- **showing**: ``ESC [ …`` sequences, carriage returns and bidirectional overrides in a name
  would move the cursor, recolour or rewrite the operator's terminal (a forged ``PASSED``).
  :func:`printable` shows every control character as an escape (``\\x1b``) instead; newlines
  and tabs stay, for the tracebacks and reports that use them.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
"""C0 and C1 controls (but tab and newline), DEL, and the bidirectional formatting marks."""


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


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters and bidi marks shown as escapes."""
    return _CONTROL.sub(_escape, lossless(text))


__all__ = ["lossless", "printable"]
