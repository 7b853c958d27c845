"""JSON from a checkpoint, parsed within bounds.

A checkpoint's JSON (a safetensors header, an index, ``trainer_state.json``, a framework's
manifest) is written by whoever could write the checkpoint. Python's parser turns nesting
deeper than the interpreter's recursion limit into a ``RecursionError``, and nesting just
below it into a document that every later recursive walk (evidence, rendering) would fail on.
:func:`loads` is the one parse of such bytes: invalid JSON, or JSON nested deeper than
:data:`MAX_DEPTH`, is a :class:`json.JSONDecodeError` (a ``ValueError``) naming why — damage
the caller reports as a finding, never an internal error.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 128
"""Containers within containers a checkpoint's JSON may nest: far beyond what any writer drill
knows writes (a few levels), far below what a recursive walk of it could not bear."""


def loads(data: bytes | bytearray | memoryview | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The document ``data`` holds; :class:`json.JSONDecodeError` for anything that is not
    JSON within ``max_depth`` levels (bytes that are not UTF-8 included)."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"not UTF-8 ({exc.reason} at byte {exc.start})", "", 0) from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested deeper than the parser can follow", "", 0) from None
    if depth(doc, max_depth) > max_depth:
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", "", 0)
    return doc


def depth(doc: Any, stop: int = MAX_DEPTH) -> int:
    """How deep ``doc``'s containers nest (walked without recursion; counting stops past ``stop``)."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, level)
        if level > stop:
            return level
        stack.extend((child, level + 1) for child in node if isinstance(child, (dict, list)))
    return deepest


__all__ = ["MAX_DEPTH", "depth", "loads"]
