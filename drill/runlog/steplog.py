"""The original run's record of what it did at each step, for later comparison.

One JSON object a line in ``drill-steps.jsonl`` in the run directory. Floats are written with
``repr`` precision, so a loss read back is bit-for-bit the float that was logged. In a run of
many ranks, rank 0 writes ``drill-steps.jsonl`` (the run's log: the global loss, the global
batch) and each rank ``r`` may also keep its own, ``drill-steps.rank<r>.jsonl`` (what that rank
saw: its slice of the batch, its local loss) — one file per writer, so no two processes append
to one file on a shared filesystem. A replay by as many ranks compares each rank with its own.
"""

from __future__ import annotations

import json
import os
import re
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
    rank: int | None = None
    """The rank that logged it, in a run where each rank keeps its own log."""


def rank_log(rank: int | None) -> str:
    """The step log's file name for ``rank`` (None: the run's own, ``drill-steps.jsonl``)."""
    return STEP_LOG if rank is None else f"drill-steps.rank{rank}.jsonl"


RANK_LOG = re.compile(r"^drill-steps\.rank(0|[1-9][0-9]*)\.jsonl\Z")


class StepLog:
    """Appends :class:`StepRecord` lines; ``sync()`` makes them durable (call it at each save).
    ``rank``: this is that rank's own log, in a run where every rank logs (see the module);
    None: the run's log."""

    def __init__(self, run_dir: str | os.PathLike[str], *, rank: int | None = None) -> None:
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"rank must be a non-negative integer, not {rank!r}")
        self.rank = rank
        self.path = Path(run_dir) / rank_log(rank)
        self._file = open(self.path, "a", encoding="utf-8")

    def append(self, step: int, *, loss: float, **fields: Any) -> None:
        record = StepRecord(step=step, loss=float(loss), rank=self.rank, **fields)
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
                **{k: doc[k] for k in ("step", "loss", "grad_norm", "batch", "lr", "tokens", "rank") if k in doc}
            )
        except (ValueError, TypeError, KeyError, RecursionError):
            continue
        rank_ok = record.rank is None or (
            isinstance(record.rank, int) and not isinstance(record.rank, bool) and record.rank >= 0
        )
        if isinstance(record.step, int) and isinstance(record.loss, (int, float)) and rank_ok:
            records.append(record)
    return records
