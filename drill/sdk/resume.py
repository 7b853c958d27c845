"""A verified load for the trainer's own resume: every real restore is a drill.

    import drill.sdk

    try:
        drill.sdk.load(state, checkpoint_id=ckpt)            # was: dcp.load(state, checkpoint_id=ckpt)
    except drill.sdk.CheckpointCorrupt as exc:
        ckpt = drill.sdk.last_good(run_dir, before=ckpt)     # fall back, and say why
        drill.sdk.load(state, checkpoint_id=ckpt)

``load`` is ``dcp.load`` (same ``Stateful`` semantics, resharding, process groups) through
drill's reader: ``.metadata`` through the allow-list unpickler, entries with
``weights_only=True``, each file read once and hashed as it streams past, a large tensor's
bytes copied once, straight from storage into its target. After the read the digests are
compared with the checkpoint's seal (``drill-manifest.json``); a mismatch raises
:class:`CheckpointCorrupt` naming the file and byte range, on every rank alike. The resume is
recorded as a drill with trigger ``resume`` (ranks, latency per phase) in the local spool — a
file, no database driver imported, nothing raised into the trainer — which the next drill, the
scheduler or ``drill db flush`` delivers to the database.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from drill.sdk.report import TRIGGER, CheckpointCorrupt, LoadReport


def load(
    state: dict[str, Any],
    checkpoint_id: str,
    *,
    verify: bool = True,
    record: bool = True,
    process_group: Any = None,
    planner: Any = None,
    db: str | None = None,
    key: bytes | None = None,
    allow_classes: tuple[str, ...] = (),
) -> LoadReport:
    """Load ``checkpoint_id`` into ``state`` like ``dcp.load``, verifying it in the same read.

    ``verify``: compare every byte read with the seal (an unsealed checkpoint gets DCP's
    structural proof only: the evidence says so). ``record``: record the resume as a drill
    (``db``: a database URL, default as the CLI). ``key``: the seal key, to authenticate the
    seal. Raises :class:`CheckpointCorrupt` when the checkpoint is damaged (``state`` may
    then hold part of it, so load the fallback into the same objects), and
    :class:`~drill.errors.StorageProblem` when the storage would not serve it (falling back
    would not help: nothing is known about the checkpoint).
    """
    from drill.sdk.verified_load import raise_unless_passed, run_load

    started = time.perf_counter()
    began = datetime.now(timezone.utc)
    report, checks, result = run_load(state, checkpoint_id, verify, process_group, planner, key, allow_classes)
    report.seconds["total"] = time.perf_counter() - started
    if record and _is_coordinator(process_group):
        report.record = _spool_record(report, checks, len(result.files), began, db)
    raise_unless_passed(report, checks)
    return report


def verified(
    checkpoint: str,
    *,
    record: bool = True,
    db: str | None = None,
    key: bytes | None = None,
    allow_classes: tuple[str, ...] = (),
) -> str:
    """``checkpoint``, once its bytes are proven (against its seal; an unsealed one gets its
    format's structural proof) — for trainers that load checkpoints by themselves:

        trainer.train(resume_from_checkpoint=drill.sdk.verified(ckpt))

    This reads the checkpoint once more than the resume does (the trainer's own load then
    mostly hits the page cache). Recorded like :func:`load`; raises :class:`CheckpointCorrupt`.
    """
    from drill.sdk.verified_load import raise_unless_passed, verify_for_resume

    began = datetime.now(timezone.utc)
    report, checks, files = verify_for_resume(checkpoint, key, allow_classes)
    if record:
        report.record = _spool_record(report, checks, files, began, db)
    raise_unless_passed(report, checks)
    return report.checkpoint


def _is_coordinator(process_group: Any) -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank(process_group) == 0


def _spool_record(report: LoadReport, checks: list[Any], files: int, began: datetime, db: str | None) -> Path | None:
    """The resume's drill record, written to the spool — a file, no database driver imported
    on the trainer's host: 0.02 CPU-s for a process's first record (the record's model is
    imported then), a few milliseconds after (``benchmarks/limit.py``) — for the next drill,
    the scheduler or ``drill db flush`` (:func:`flush_records`) to deliver. Nothing from here
    reaches the trainer: a spool that cannot be written leaves the resume unrecorded, never
    failed."""
    from drill.records.spool import spool_record
    from drill.sdk.verified_load import outcome_of

    return spool_record(outcome_of(report, checks, files, began).to_document(), db)


def flush_records(db: str | None = None) -> int:
    """Deliver this host's spooled records (resumes and saves included) to the database now;
    how many were delivered. What ``drill db flush`` does, at a moment the trainer chooses
    (it imports the database layer: about half a CPU-second)."""
    from drill.records.db import open_database
    from drill.records.recorder import DatabaseRecorder

    database = open_database(db)
    try:
        return DatabaseRecorder(database).flush().delivered
    finally:
        database.close()


def last_good(
    root: str, *, before: str | None = None, db: str | None = None, min_evidence: str = "structural"
) -> str | None:
    """The checkpoint to fall back to: the newest complete checkpoint under ``root`` (older
    than ``before``, when given) whose latest drill passed on at least ``min_evidence``
    (``structural``, ``sealed`` or ``authenticated``), or — for one never drilled — whose bytes
    prove out now at that level. A checkpoint whose latest drill did not pass never is. None
    when there is none."""
    from drill.claims import parse_level
    from drill.sdk.verified_load import fallback

    return fallback(root, before, db, parse_level(min_evidence))


__all__ = ["TRIGGER", "CheckpointCorrupt", "LoadReport", "flush_records", "last_good", "load", "verified"]
