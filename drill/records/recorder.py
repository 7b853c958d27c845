"""The database recorder: a drill that got a row always ends with a final status.

Every write is retried when the failure is transient (a lock held past the busy timeout, a
dropped connection). A write that still fails mid-drill is noted and the drill goes on —
its evidence matters more than its progress markers. At the end, the full outcome is written
in one transaction; if that fails, the row is closed as ``error`` with the reason and the
real verdict in its message; if even that fails, the outcome goes to the local
:class:`~drill.records.spool.Spool`, which the next drill delivers. Either way the caller gets
the verdict back to print, with ``record_problem`` saying what happened to the record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from drill.errors import DatabaseError, UnreadableRecord
from drill.findings import CheckResult
from drill.integrity.coverage import CoverageUpdate
from drill.pipeline.outcome import CheckpointInfo, DocumentVersionError, DrillOutcome, check_version
from drill.pipeline.recorder import DrillStart
from drill.records.db import Database, safe_url
from drill.records.spool import SAVE_VERSION, Spool, is_save
from drill.records.store import Records
from drill.records.urls import database_key

log = logging.getLogger("drill.records")
T = TypeVar("T")

ATTEMPTS = 3
BACKOFF = (0.2, 1.0)


@dataclass(slots=True)
class FlushResult:
    delivered: int = 0
    waiting: int = 0
    """Left spooled because the database is still away."""
    rejected: dict[str, str] = field(default_factory=dict)
    """Spool files that will never be delivered as they are, and why."""

    @property
    def left(self) -> int:
        return self.waiting + len(self.rejected)


class DatabaseRecorder:
    def __init__(self, db: Database, *, spool: Spool | None = None, attempts: int = ATTEMPTS) -> None:
        self.records = Records(db)
        self.spool = spool or Spool(
            database_key(db.url), aliases=(safe_url(db.url),)
        )  # the name drill 0.5 and older spooled under
        self.attempts = attempts
        self.id: int | None = None
        self.checkpoint_id: int | None = None
        self.problem: str | None = None
        """The first record write that failed mid-drill, if any."""
        self.away = False
        """A transient failure outlasted every retry: the database is away, and each later
        write is tried once (it may be back) instead of waiting out the backoff again."""

    # -- the protocol -----------------------------------------------------------------------
    def begin(self, start: DrillStart) -> int | None:
        self.reconcile()
        try:
            self.id = self._retry(lambda: self.records.begin_drill(start))
        except DatabaseError as exc:
            self.problem = f"the drill could not be recorded when it began ({exc.message})"
        return self.id

    def phase(self, name: str) -> None:
        drill_id = self.id
        if drill_id is not None:
            self._best_effort(f"phase {name}", lambda: self.records.set_phase(drill_id, name))

    def selected(
        self, checkpoint: CheckpointInfo, *, selection: str, evidence_level: str | None, sample: str | None
    ) -> None:
        drill_id = self.id
        if drill_id is None:
            return
        self.checkpoint_id = self._best_effort(
            "checkpoint",
            lambda: self.records.attach_checkpoint(
                drill_id, checkpoint, selection=selection, evidence_level=evidence_level, sample=sample
            ),
        )

    def last_drilled(self, run_root: str) -> Mapping[str, datetime]:
        return self._best_effort("last drilled", lambda: self.records.last_drilled(run_root)) or {}

    def last_verified(self, checkpoint_uri: str) -> Mapping[str, datetime]:
        ledger = (
            self._best_effort(
                "coverage ledger", lambda: self.records.last_verified(self.records.checkpoint_id(checkpoint_uri))
            )
            or {}
        )
        return {path: when for path, (when, _) in ledger.items()}

    def verified(self, checkpoint: CheckpointInfo, update: CoverageUpdate, days: float) -> float | None:
        checkpoint_id = self.checkpoint_id
        if checkpoint_id is None:
            return None
        return self._best_effort(
            "coverage ledger", lambda: self.records.apply_coverage(checkpoint_id, self.id, update, days)
        )

    def checks(self, results: list[CheckResult]) -> None:
        if self.id is not None:
            self._best_effort("checks", lambda: self.records.add_checks(self.id, results))  # type: ignore[arg-type]

    def finish(self, outcome: DrillOutcome) -> None:
        try:
            self._finish(outcome)
        except Exception as exc:
            outcome.record_problem = f"the record could not be written: {exc}"
            log.exception("drill record")

    # -- closing, whatever it takes ---------------------------------------------------------
    def _finish(self, outcome: DrillOutcome) -> None:
        try:
            if self.id is not None:
                self._retry(lambda: self.records.finish_drill(outcome))
            else:
                self._retry(lambda: self.records.insert_outcome(outcome))
            if self.problem:
                outcome.record_problem = f"recorded, but {self.problem}"
            return
        except DatabaseError as exc:
            reason = exc.message
        if self.id is not None:
            text = f"the verdict could not be recorded ({reason}): the drill {outcome.status.value}" + (
                f": {outcome.message}" if outcome.message else ""
            )
            try:
                self._retry(lambda: self.records.close_as_error(self.id, text))  # type: ignore[arg-type]
                outcome.record_problem = (
                    f"drill #{self.id} is closed as error: the full verdict could not be written ({reason})"
                )
                return
            except DatabaseError:
                pass
        path = self.spool.put(outcome.to_document())
        outcome.record_problem = (
            f"the database is unavailable ({reason}): the verdict is kept in {path} until the next drill delivers it"
        )

    def reconcile(self) -> None:
        """Deliver spooled verdicts, then close drills whose process is gone (in that order:
        a spooled verdict is the truth about its drill; "process gone" is only a guess)."""
        self.flush()
        self._best_effort("orphan recovery", self.records.recover_orphans)

    def flush(self) -> FlushResult:
        """Spooled verdicts onto the database, each exactly once (claimed first, so concurrent
        flushes never deliver one twice); what cannot be delivered is named, never skipped."""
        result = FlushResult()
        pending = self.spool.pending()
        result.rejected = {str(p): why for p, why in pending.rejected.items()}
        for i, (path, doc) in enumerate(pending.documents):
            if is_save(doc):
                if not self._deliver_save(path, doc, result):
                    result.waiting = len(pending.documents) - i
                    return result
                continue
            try:
                outcome = DrillOutcome.from_document(doc)
            except DocumentVersionError as exc:  # kept for a newer drill to deliver
                result.rejected[str(path)] = f"written by a newer drill: {exc}"
                continue
            except Exception as exc:  # noqa: BLE001 - any shape that is not an outcome document
                result.rejected[str(path)] = f"not an outcome document ({type(exc).__name__}: {exc})"
                continue
            claimed = self.spool.claim(path)
            if claimed is None:
                continue  # another flush took it
            try:
                if self.records.deliver(outcome):
                    result.delivered += 1
                self.spool.done(claimed)
            except UnreadableRecord as exc:
                result.rejected[str(claimed)] = f"cannot be written as a record ({exc.message})"
            except DatabaseError:
                result.waiting = len(pending.documents) - i  # still away: try again next time
                return result
        if result.rejected:
            log.warning("spooled verdicts that cannot be delivered: %s", result.rejected)
            self.problem = (
                self.problem
                or f"{len(result.rejected)} spooled file(s) in {self.spool.directory} cannot be delivered: drill db flush names them"
            )
        return result

    def _deliver_save(self, path: Any, doc: dict[str, Any], result: FlushResult) -> bool:
        """A spooled save onto the database (once); False when the database is still away."""
        try:
            check_version(doc, SAVE_VERSION, "save")
        except DocumentVersionError as exc:  # kept for a newer drill to deliver
            result.rejected[str(path)] = f"written by a newer drill: {exc}"
            return True
        claimed = self.spool.claim(path)
        if claimed is None:
            return True
        try:
            if self.records.record_save(doc):
                result.delivered += 1
            self.spool.done(claimed)
        except (ValueError, TypeError, UnreadableRecord) as exc:
            result.rejected[str(claimed)] = f"not a save document ({exc})"
        except DatabaseError:
            return False
        return True

    def _exists(self, drill_id: int) -> bool:
        try:
            self.records.get(drill_id)
            return True
        except Exception:  # noqa: BLE001 - NotFound, or a row that will not read: insert anew
            return False

    def _retry(self, fn: Callable[[], T]) -> T:
        attempts = 1 if self.away else self.attempts
        for attempt in range(attempts):
            try:
                result = fn()
            except DatabaseError as exc:
                if not getattr(exc, "transient", False):
                    raise
                if attempt + 1 == attempts:
                    self.away = True
                    raise
                time.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            else:
                self.away = False
                return result
        raise AssertionError("unreachable")

    def _best_effort(self, what: str, fn: Callable[[], T]) -> T | None:
        try:
            return self._retry(fn)
        except DatabaseError as exc:
            self.problem = self.problem or f"writing the {what} failed ({exc.message})"
            return None
