"""What a verified load returns or raises: :class:`LoadReport` and :class:`CheckpointCorrupt`.

Kept apart from :mod:`drill.sdk.resume` (the entry points) and
:mod:`drill.sdk.verified_load` (the work) so that both can name them without importing each
other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRIGGER = "resume"


class CheckpointCorrupt(RuntimeError):
    """The checkpoint's bytes or entries are not what was saved: the trainer should fall back.

    ``file`` and ``byte_ranges`` name where (when the damage is in the bytes), ``findings``
    every problem found, ``drill_id`` the record (None until it is written)."""

    def __init__(
        self, checkpoint: str, findings: list[Any], byte_ranges: dict[str, list[tuple[int, int]]] | None = None
    ) -> None:
        first = findings[0]
        self.checkpoint = checkpoint
        self.findings = findings
        self.file: str | None = first.subject
        self.byte_ranges: list[tuple[int, int]] = list((byte_ranges or {}).get(first.subject or "", ()))
        more = f" (and {len(findings) - 1} more problem(s))" if len(findings) > 1 else ""
        super().__init__(f"{checkpoint}: {first.message}{more}")


@dataclass(slots=True)
class LoadReport:
    """What one verified load did: returned by :func:`load`."""

    checkpoint: str
    sealed: bool
    evidence: str = "structural"
    """What the load's proof rests on (:mod:`drill.claims`): ``authenticated``, ``sealed``,
    ``structural`` (an unsealed checkpoint: DCP's index and torch.save's CRC-32s) or ``none``."""
    format: str = "dcp"
    verified_files: int = 0
    bytes_read: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    """``plan`` (listing and seal), ``read`` (waiting on storage), ``load`` (into the targets),
    ``verify`` (comparing digests), ``total``."""
    ranks: int = 1
    byte_ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """File → byte ranges that differ from the seal (empty when none do)."""
    record: Path | None = None
    """Where the resume's drill record waits for delivery to the database (the spool), or None
    when it was not recorded (``record=False``, or the spool could not be written)."""
