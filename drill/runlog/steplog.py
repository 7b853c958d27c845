"""The original run's record of what it did at each step, for later comparison.

One JSON object a line in ``drill-steps.jsonl`` in the run directory. Floats are written with
``repr`` precision, so a loss read back is bit-for-bit the float that was logged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from drill import safe_json

STEP_LOG = "drill-steps.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    step: int
    """The step count *after* this optimizer step (the first step is 1)."""
    loss: float
    grad_norm: float | None = None
    batch: str | None = None
    """Fingerprint of the batch's token/sample ids (xxh3-64 hex)."""
    lr: float | None = None
    tokens: int | None = None


class StepLog:
    """Appends :class:`StepRecord` lines; ``sync()`` makes them durable (call it at each save)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / STEP_LOG
        self._file = open(self.path, "a", encoding="utf-8")

    def append(self, step: int, *, loss: float, **fields: Any) -> None:
        record = StepRecord(step=step, loss=float(loss), **fields)
        doc = {k: v for k, v in asdict(record).items() if v is not None}
        self._file.write(json.dumps(doc, separators=(",", ":")) + "\n")

    def sync(self) -> None:
        # fsync at checkpoint time, not every step: the log must be at least as durable as the
        # newest checkpoint, and an fsync per step would slow a fast training loop.
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_step_log(run_dir: str | os.PathLike[str]) -> list[StepRecord]:
    """All records, in file order; a torn last line (a crash mid-write) is ignored."""
    with open(Path(run_dir) / STEP_LOG, encoding="utf-8") as f:
        return parse_step_log(f)


def parse_step_log(lines: Iterable[str]) -> list[StepRecord]:
    """Step records from JSON lines; lines that are not one (a torn last line) are skipped."""
    records = []
    for line in lines:
        try:
            doc = safe_json.loads(line)
            record = StepRecord(
                **{k: doc[k] for k in ("step", "loss", "grad_norm", "batch", "lr", "tokens") if k in doc}
            )
        except (ValueError, TypeError, KeyError, RecursionError):
            continue
        if isinstance(record.step, int) and isinstance(record.loss, (int, float)):
            records.append(record)
    return records
