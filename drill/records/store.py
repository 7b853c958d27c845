"""Writing and reading drill records.

A drill row is committed when the drill starts and completed when it ends, each in its own
short transaction, so a crash mid-drill leaves a ``running`` row behind as a visible trace and
never rolls back a record already written. The row holds everything
:class:`~drill.pipeline.outcome.DrillOutcome` does, so a recorded drill is read back as the
same outcome, and prints as the same document, as the run that produced it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from drill.claims import DEFAULT_MIN_EVIDENCE, good_enough
from drill.errors import DatabaseError, ExitCode, NotFound, UnreadableRecord, one_line
from drill.findings import CheckResult
from drill.pipeline.outcome import DrillOutcome
from drill.pipeline.recorder import DrillStart
from drill.records.audit import PROVISIONAL, attest, load_audit_key, seal_drill
from drill.records.bursts import BurstsMixin
from drill.records.db import Database, failure_reason, safe_url
from drill.records.lease import LeaseMixin
from drill.records.ledger import LedgerMixin
from drill.records.models import Alert, Checkpoint, CheckRecord, Drill, ReplayStep
from drill.records.reporting import ReportingMixin
from drill.records.rows import (
    checkpoint_row,
    details_of,
    outcome_from_row,
    outcome_loads,
    utcnow,
    write_outcome,
)
from drill.records.saves import SavesMixin
from drill.verdict import DrillStatus

ORPHAN_REASON = "the process running this drill"


class Records(LedgerMixin, LeaseMixin, ReportingMixin, SavesMixin, BurstsMixin):
    """The one place that reads and writes drill's tables."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._key: bytes | None | bool = False  # not loaded yet

    def _audit_key(self, doing: str) -> bytes | None:
        if self._key is False:
            from drill.integrity.keys import SealKeyError

            try:
                self._key = load_audit_key()
            except SealKeyError as exc:
                raise DatabaseError(f"{doing}: {exc}") from None
        return self._key or None  # type: ignore[return-value]

    def _seal(self, s: Session, drill_id: int, closed_by: str = "drill") -> None:
        """Append the drill, just closed in this transaction, to the audit chain. A configured
        audit key that cannot be read fails the transaction: a record is never sealed without
        the key it should carry (the verdict then goes to the spool, never lost)."""
        seal_drill(s, drill_id, self._audit_key("the record cannot be sealed"), closed_by)

    def _attest(self, s: Session, outcomes: Iterable[DrillOutcome]) -> None:
        """Each record read is checked against its audit seal as it is read
        (:func:`drill.records.audit.attest`): what a command shows, selects or reports says
        whether the record is the one that was sealed. A configured audit key that cannot be
        read is an error: no record is vouched for without it."""
        listed = [o for o in outcomes if o.id is not None]
        seals = attest(s, [o.id for o in listed], self._audit_key("the records cannot be checked against their seals"))  # type: ignore[misc]
        for o in listed:
            o.seal = seals.get(o.id)  # type: ignore[arg-type]

    @contextmanager
    def _session(self) -> Iterator[Session]:
        """A transaction; a stored value drill cannot turn back into a record (a time that is
        not a time, a status it does not know, broken JSON — a row edited outside drill) is an
        :class:`UnreadableRecord` naming it, not a crash."""
        try:
            with self.db.bounded(), self.db.sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            err = DatabaseError(f"database {safe_url(self.db.url)}: {failure_reason(exc)}")
            err.transient = isinstance(exc, OperationalError)  # locked, connection lost: worth retrying
            raise err from None
        except (ValueError, TypeError) as exc:
            raise UnreadableRecord(
                f"database {safe_url(self.db.url)} holds a record drill cannot read ({one_line(exc)}): was it edited outside drill?"
            ) from None

    # -- a drill's row, from begin to finish -------------------------------------------------
    def begin_drill(self, start: DrillStart, *, pid: int | None = None, host: str | None = None) -> int:
        with self._session() as s:
            pid = os.getpid() if pid is None else pid
            drill = Drill(
                run_root=start.run_root,
                selector=start.selector,
                trigger=start.trigger,
                host=host or socket.gethostname(),
                pid=pid,
                process_start=process_start(pid),
                device=start.device,
                started_at=start.started_at,
                status=DrillStatus.RUNNING.value,
                phase="start",
                policy=start.policy,
                drill_version=start.versions.get("drill") or "",
                torch_version=start.versions.get("torch"),
                job_id=start.job_id,
            )
            s.add(drill)
            s.flush()
            if start.job_id:
                self._close_earlier_attempts(s, drill)
            return drill.id

    def _close_earlier_attempts(self, s: Session, drill: Drill) -> None:
        """A batch job restarted (Slurm's requeue, torchrun's ``--max-restarts``) runs the drill
        again under the same job id: an earlier attempt still ``running`` ended when its job
        was restarted — closed ``aborted``, naming the attempt that continues it."""
        earlier = s.scalars(
            select(Drill).where(
                Drill.job_id == drill.job_id, Drill.id < drill.id, Drill.status == DrillStatus.RUNNING.value
            )
        )
        for d in earlier:
            d.status, d.exit_code, d.finished_at = DrillStatus.ABORTED.value, int(ExitCode.TERMINATED), utcnow()
            d.message = d.error = (
                f"its batch job {drill.job_id} was restarted: continued by drill #{drill.id} "
                f"(last phase reached: {d.phase})"
            )
            self._seal(s, d.id, "restart")

    def record_lost(
        self, start: DrillStart, *, status: DrillStatus, exit_code: int, reason: str, host: str | None = None
    ) -> int:
        """A drill that ended before it could write a row of its own (its process died, its
        batch job never started): it still goes on the record — on ``host``, where it ran,
        when that is known — and into the audit chain."""
        drill_id = self.begin_drill(start, host=host)
        self.close_dead_drill(drill_id, status=status, exit_code=exit_code, reason=reason)
        return drill_id

    def by_job(self, job_id: str) -> int | None:
        """The latest drill a batch job ran."""
        with self._session() as s:
            return s.scalar(select(Drill.id).where(Drill.job_id == job_id).order_by(Drill.id.desc()).limit(1))

    def set_phase(self, drill_id: int, phase: str) -> None:
        with self._session() as s:
            s.get_one(Drill, drill_id).phase = phase

    def attach_checkpoint(
        self, drill_id: int, outcome_checkpoint: Any, *, selection: str, evidence_level: str | None, sample: str | None
    ) -> int:
        """Record (or refresh) the checkpoint and link the drill to it; returns its id."""
        with self._session() as s:
            ckpt = checkpoint_row(s, drill_run_root(s, drill_id), outcome_checkpoint)
            d = s.get_one(Drill, drill_id)
            d.checkpoint_id, d.selection, d.evidence_level, d.sample = ckpt.id, selection, evidence_level, sample
            return ckpt.id

    def add_checks(self, drill_id: int, results: list[CheckResult]) -> None:
        """The checks of a drill still running (a crash after them leaves them on the record)."""
        with self._session() as s:
            s.get_one(Drill, drill_id).details = details_of(s, results, [])

    def finish_drill(self, outcome: DrillOutcome, *, closed_by: str = "drill") -> None:
        """Write the whole outcome onto its row: verdict, timings, every check, the replay."""
        assert outcome.id is not None
        with self._session() as s:
            d = s.get_one(Drill, outcome.id)
            write_outcome(s, d, outcome)
            self._seal(s, d.id, closed_by)

    def insert_outcome(self, outcome: DrillOutcome, *, closed_by: str = "drill") -> int:
        """A drill that ran without a row (the database was away when it began)."""
        with self._session() as s:
            d = Drill(
                run_root=outcome.run_root, selector=outcome.selector, trigger=outcome.trigger, host=outcome.host, pid=outcome.pid,
                device=outcome.device, started_at=outcome.started_at, status=DrillStatus.RUNNING.value, phase=outcome.phase,
                policy=outcome.policy, drill_version=outcome.versions.get("drill") or "", torch_version=outcome.versions.get("torch"),
            )  # fmt: skip
            s.add(d)
            s.flush()
            outcome.id = d.id
            write_outcome(s, d, outcome)
            self._seal(s, d.id, closed_by)
            return d.id

    def deliver(self, outcome: DrillOutcome) -> bool:
        """A spooled verdict onto the database, exactly once: onto its own row while that is
        still open (``running``, or closed only by orphan recovery's guess), as a new row when
        it never had one — unless a row of the same drill (host, pid, start) is already there.
        Returns False when it had been delivered before (a flush that died before unlinking)."""
        with self._session() as s:
            d = s.get(Drill, outcome.id) if outcome.id is not None else None
            if d is None:
                twin = s.scalar(
                    select(Drill.id).where(
                        Drill.host == outcome.host, Drill.pid == outcome.pid, Drill.started_at == outcome.started_at
                    )
                )
                if twin is not None and outcome.id is None:
                    return False
        if d is None:
            outcome.id = None
            self.insert_outcome(outcome, closed_by="spool")
            return True
        guessed = d.status == DrillStatus.ABORTED.value and (d.error or "").startswith(ORPHAN_REASON)
        if d.status != DrillStatus.RUNNING.value and not guessed:
            return False
        self.finish_drill(outcome, closed_by="spool")
        return True

    def close_as_error(self, drill_id: int, reason: str) -> None:
        """The last resort when the full verdict cannot be written: the row is closed anyway."""
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            d.status, d.exit_code, d.finished_at = DrillStatus.ERROR.value, 5, utcnow()
            d.message = d.error = reason[:10000]
            self._seal(s, drill_id, "error-close")

    def record_alerts(self, drill_id: int, deliveries: list[Any]) -> None:
        with self._session() as s:
            for dl in deliveries:
                s.add(
                    Alert(
                        drill_id=drill_id,
                        channel=dl.channel,
                        target=dl.target,
                        delivered=dl.delivered,
                        attempts=dl.attempts,
                        error=dl.error,
                        sent_at=utcnow(),
                    )
                )

    # -- drills a dead process left behind ---------------------------------------------------
    def running_drill_of(self, pid: int) -> int | None:
        """The drill a (child) process on this host left ``running``, if any."""
        with self._session() as s:
            return s.scalar(
                select(Drill.id)
                .where(Drill.pid == pid, Drill.host == socket.gethostname(), Drill.status == DrillStatus.RUNNING.value)
                .order_by(Drill.id.desc())
            )

    def close_dead_drill(self, drill_id: int, *, status: DrillStatus, exit_code: int, reason: str) -> bool:
        """Finish a drill whose process died before it could: the record says how and where.
        Returns False when the drill had already closed itself."""
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            # Another drill's orphan recovery may have closed it first, knowing only that the
            # process is gone; the parent that saw it die knows how, and says so.
            recovered = d.status == DrillStatus.ABORTED.value and (d.error or "").startswith(ORPHAN_REASON)
            if d.status != DrillStatus.RUNNING.value and not recovered:
                return False
            d.status, d.exit_code, d.finished_at = status.value, exit_code, utcnow()
            d.message = d.error = f"{reason} (last phase reached: {d.phase})"
            self._seal(s, drill_id, "parent")
            return True

    def recover_orphans(self) -> list[int]:
        """Drills left ``running`` on this host by a process seen to be gone → ``aborted``."""
        host = socket.gethostname()
        with self._session() as s:
            rows = list(s.scalars(select(Drill).where(Drill.status == DrillStatus.RUNNING.value, Drill.host == host)))
            recovered = []
            for d in rows:
                if process_alive(d.pid, d.process_start):
                    continue
                d.status, d.exit_code, d.finished_at = DrillStatus.ABORTED.value, 130, utcnow()
                d.message = d.error = (
                    f"{ORPHAN_REASON} (pid {d.pid} on {host}) is gone and never closed this record: "
                    f"it was killed or crashed (last phase reached: {d.phase})"
                )
                recovered.append(d.id)
            for drill_id in recovered:
                self._seal(s, drill_id, PROVISIONAL)
            return recovered

    # -- reading ----------------------------------------------------------------------------
    def history(
        self,
        *,
        run_root: str | None = None,
        limit: int = 50,
        since: datetime | None = None,
        status: str | None = None,
        policy: str | None = None,
    ) -> list[DrillOutcome]:
        """Recorded drills, newest first (without their checks)."""
        with self._session() as s:
            q = select(Drill).options(*outcome_loads(with_checks=False)).order_by(Drill.id.desc()).limit(limit)
            if run_root is not None:
                q = q.where(Drill.run_root == run_root)
            if since is not None:
                q = q.where(Drill.started_at >= since)
            if status is not None:
                q = q.where(Drill.status == status)
            if policy is not None:
                q = q.where(Drill.policy == policy)
            out = [outcome_from_row(d, with_checks=False) for d in s.scalars(q)]
            self._attest(s, out)
            return out

    def get(self, drill_id: int) -> DrillOutcome:
        with self._session() as s:
            d = s.scalar(select(Drill).where(Drill.id == drill_id).options(*outcome_loads(with_checks=True)))
            if d is None:
                raise NotFound(f"no drill with id {drill_id}")
            out = outcome_from_row(d, with_checks=True)
            self._attest(s, [out])
            return out

    def last_drilled(self, run_root: str) -> dict[str, datetime]:
        """Checkpoint URI → when it was last drilled (any outcome), for coverage-aware selection."""
        with self._session() as s:
            rows = s.execute(
                select(Checkpoint.uri, func.max(Drill.started_at))
                .join(Drill, Drill.checkpoint_id == Checkpoint.id)
                .where(Checkpoint.run_root == run_root)
                .group_by(Checkpoint.uri)
            )
            return {uri: aware(t) for uri, t in rows}

    def latest_of(self, uris: list[str]) -> dict[str, DrillOutcome]:
        """Checkpoint URI → its latest closed drill, for those of ``uris`` ever drilled."""
        out: dict[str, DrillOutcome] = {}
        with self._session() as s:
            for uri in uris:
                latest = s.scalar(
                    select(Drill)
                    .join(Checkpoint, Drill.checkpoint_id == Checkpoint.id)
                    .where(Checkpoint.uri == uri, Drill.status != DrillStatus.RUNNING.value)
                    .order_by(Drill.id.desc())
                    .limit(1)
                    .options(*outcome_loads(with_checks=False))
                )
                if latest is not None:
                    out[uri] = outcome_from_row(latest, with_checks=False)
            self._attest(s, out.values())
        return out

    def last_good(
        self,
        run_root: str,
        retained: list[str],
        *,
        min_evidence: str = DEFAULT_MIN_EVIDENCE,
        require_replay: bool = False,
        broken: list[DrillOutcome] | None = None,
    ) -> DrillOutcome | None:
        """The newest of ``retained`` (URIs, oldest first) whose latest drill passed on at
        least ``min_evidence`` (and replayed, with ``require_replay``): :func:`drill.claims.good_enough`.
        The latest drills of newer checkpoints whose records fail their audit seal are passed
        over (and added to ``broken``, when given)."""
        latest = self.latest_of(list(reversed(retained)))
        for uri in reversed(retained):
            outcome = latest.get(uri)
            if outcome is not None and good_enough(outcome, min_evidence=min_evidence, require_replay=require_replay):
                return outcome
            if outcome is not None and outcome.seal is not None and outcome.seal.broken and broken is not None:
                broken.append(outcome)
        return None

    def delete_checks(self, drill_id: int) -> None:
        with self._session() as s:
            s.execute(delete(CheckRecord).where(CheckRecord.drill_id == drill_id))
            s.execute(delete(ReplayStep).where(ReplayStep.drill_id == drill_id))


def drill_run_root(s: Session, drill_id: int) -> str:
    return s.get_one(Drill, drill_id).run_root


def aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def process_start(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int, started: int | None) -> bool:
    """Whether the process that began a drill still runs (not merely some process with its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = process_start(pid)
    return started is None or now is None or now == started


__all__ = ["ORPHAN_REASON", "Records", "aware", "process_alive", "process_start", "utcnow"]
