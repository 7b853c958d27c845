"""The verdict file: where a drill leaves its verdict for a launcher to read.

torchrun turns every exit code of its workers into 1, and a batch script's exit code is that
of its last command: a launcher cannot tell ``failed`` from ``error`` from ``aborted`` by how
its ranks exited. So ``drill run --verdict-file PATH`` (or ``$DRILL_VERDICT_FILE``) writes the
verdict — the drill's id, status, exit code and message — as one JSON object, atomically, once
it is recorded (rank 0; or the rank that closed rank 0's record when rank 0 was lost), and
``drill verdict PATH`` exits with that code. The Slurm script ``drill submit`` writes does
exactly that after ``srun``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from drill.errors import DrillError
from drill.storage.local import read_regular, write_file
from drill.verdict import consistent

ENV = "DRILL_VERDICT_FILE"
MAX_VERDICT_BYTES = 1 << 20
"""A verdict is a few hundred bytes; a larger file is not one."""


@dataclass(frozen=True, slots=True)
class VerdictFile:
    drill_id: int | None
    status: str
    exit_code: int
    message: str | None
    rank: int | None = None

    @property
    def line(self) -> str:
        drill = f"drill #{self.drill_id} " if self.drill_id is not None else "drill "
        return f"{drill}{self.status}" + (f": {self.message}" if self.message and self.status != "passed" else "")


def write_verdict(path: str, verdict: VerdictFile) -> None:
    """Atomically, never through a link planted beside it (:func:`~drill.storage.local.write_file`):
    a launcher never reads half a verdict, and no one can redirect the write."""
    doc: dict[str, Any] = {
        "id": verdict.drill_id,
        "status": verdict.status,
        "exit_code": verdict.exit_code,
        "message": verdict.message,
        "rank": verdict.rank,
    }
    write_file(path, (json.dumps(doc) + "\n").encode())


def read_verdict(path: str) -> VerdictFile:
    """The verdict a drill left; :class:`DrillError` (exit 5) when there is none to read."""
    try:
        return _verdict_of(json.loads(read_regular(path, MAX_VERDICT_BYTES)))
    except FileNotFoundError:
        raise DrillError(f"no verdict at {path}: the drill ended before it decided (see its output)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise DrillError(
            f"{path} holds no drill verdict ({why}): was it written by drill run --verdict-file?"
        ) from None


def _verdict_of(doc: Any) -> VerdictFile:
    """The verdict in a document of exactly the shape :func:`write_verdict` writes: a status a
    drill ends with, an exit code that status means (an integer: not ``true``, ``1.5``, ``"1"``
    or ``1e400``; ``failed`` with 0 is no verdict), and the id, message and rank each of its
    type or null. Anything else raises ``TypeError``."""
    if not isinstance(doc, dict):
        raise TypeError("not an object")
    code, status = doc["exit_code"], doc["status"]
    optional = ((doc.get("id"), int), (doc.get("message"), str), (doc.get("rank"), int))
    if type(code) is not int or not isinstance(status, str) or not all(_of(v, t) for v, t in optional):
        raise TypeError("a field of the wrong type")
    if not consistent(status, code):
        raise TypeError(f"status {status!r} with exit code {code}: no drill ends that way")
    return VerdictFile(doc.get("id"), status, code, doc.get("message"), doc.get("rank"))


def _of(value: Any, kind: type) -> bool:
    return value is None or (type(value) is kind)


__all__ = ["ENV", "VerdictFile", "read_verdict", "write_verdict"]
