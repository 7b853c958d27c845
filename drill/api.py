"""drill's Python API: everything the CLI does, as functions.

    from drill import run_drill, DrillRequest, verify_checkpoint, seal

    outcome = run_drill(DrillRequest(root="/ckpt/run7", selector="latest"))
    print(outcome.status, outcome.exit_code, outcome.timings.restore)

Functions that touch the record database take ``db`` (a URL or an SQLite path; default
``$DRILL_DATABASE_URL``, else the embedded SQLite file).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drill.checkpoints import Discovery
    from drill.dist.context import DistContext
    from drill.pipeline import DrillOutcome, DrillRequest, Recorder
    from drill.policy.model import Policy
    from drill.records.audit import ChainReport
    from drill.restore import Progress
    from drill.scheduling.isolate import IsolatedResult
    from drill.storage import Storage


def run_drill(
    request: DrillRequest,
    *,
    db: str | None = None,
    recorder: Recorder | None = None,
    progress: Progress | None = None,
    storage: Storage | None = None,
    dist: DistContext | None = None,
) -> DrillOutcome:
    """Run one drill and record it in the database (or report it to ``recorder``).

    ``dist`` makes this process one rank of a distributed drill (see :mod:`drill.dist`):
    give rank 0 the database and every other rank a :class:`~drill.pipeline.NullRecorder`.

    Raises :class:`~drill.errors.UsageError` for a request this host cannot run and
    :class:`~drill.errors.DatabaseError` when the database cannot be opened — both before
    anything is read or recorded. Everything after that is in the outcome.
    """
    from drill.pipeline import run_drill as _run_pipeline

    if recorder is not None:
        return _run_pipeline(request, recorder, progress=progress, storage=storage, dist=dist)
    from drill.records.db import open_database
    from drill.records.recorder import DatabaseRecorder

    audit_key()  # a record is never sealed without the key it should carry
    database = open_database(db)
    try:
        return _run_pipeline(request, DatabaseRecorder(database), progress=progress, storage=storage, dist=dist)
    finally:
        database.close()


def dry_run(request: DrillRequest, *, db: str | None = None, storage: Storage | None = None) -> dict[str, Any]:
    """What :func:`run_drill` would drill, found the way it would find it — the run listed, the
    checkpoint chosen, its files listed, the replay entrypoint looked up — with nothing read
    beyond listings and nothing recorded. Raises what the drill's preflight raises."""
    from drill.integrity.manifest import MANIFEST_NAME, list_files
    from drill.pipeline.stages import Drill, replay_dir
    from drill.records.db import resolve_url, safe_url
    from drill.replay.run import entrypoint_for
    from drill.restore import NullProgress

    drill = Drill.prepare(request, _LastDrilled(db), NullProgress(), storage)  # type: ignore[arg-type]  # reads only
    ref, found = drill.inputs.ref, drill.inputs.discovery
    plan: dict[str, Any] = {
        "run_root": request.root, "retained": [c.name for c in found.checkpoints] if found else [],
        "incomplete": [s.name for s in found.incomplete] if found else [], "flags": request.flags(),
        "policy": request.policy, "database": safe_url(resolve_url(db)), "checkpoint": None,
    }  # fmt: skip
    if drill.inputs.nothing_to_drill is not None:
        plan["would_fail"] = drill.inputs.nothing_to_drill.message
    if ref is None:
        return plan
    files = (
        list_files(drill.storage, ref.uri).files
        if drill.storage.stat(ref.uri).is_dir
        else {ref.name: drill.storage.stat(ref.uri).size}
    )
    sealed = drill.storage.stat(ref.uri).is_dir and MANIFEST_NAME in {e.name for e in drill.storage.list(ref.uri)}
    entry, explicit = (
        entrypoint_for(replay_dir(drill), request.replay, drill.storage) if request.replay.enabled else (None, False)
    )
    plan["checkpoint"] = {
        "uri": ref.uri,
        "name": ref.name,
        "step": ref.step,
        "format": ref.format,
        "files": len(files),
        "bytes": sum(files.values()),
        "sealed": sealed,
    }
    plan["selection"] = drill.inputs.selection
    plan["replay"] = (
        None
        if not request.replay.enabled
        else {
            "entrypoint": entry,
            "named_by": ("--replay" if explicit else "run.json") if entry else None,
            "steps": request.replay.steps,
        }
    )
    return plan


class _LastDrilled:
    """Just enough of a recorder for a dry run: when each checkpoint was last drilled (a
    policy's least-recently-drilled selection asks), read without writing."""

    def __init__(self, db: str | None) -> None:
        self.db = db

    def last_drilled(self, run_root: str) -> Any:
        from drill.records.db import read_database
        from drill.records.store import Records

        database = read_database(self.db)
        if database is None:
            return {}
        try:
            return Records(database).last_drilled(run_root)
        finally:
            database.close()


def run_policy(policy: Policy, *, db: str | None = None, trigger: str = "policy") -> IsolatedResult:
    """Run a policy's drill isolated in a child process (timeout, memory limit), record it
    exactly once, and send its alerts."""
    from drill.records.db import open_database, resolve_url
    from drill.records.store import Records
    from drill.scheduling.isolate import run_isolated

    url = resolve_url(db)
    database = open_database(url)
    try:
        return run_isolated(policy, url, Records(database), trigger=trigger)
    finally:
        database.close()


def history(
    *,
    db: str | None = None,
    root: str | None = None,
    limit: int = 50,
    since: datetime | None = None,
    status: str | None = None,
    policy: str | None = None,
) -> list[DrillOutcome]:
    """Recorded drills, newest first (their checks are left out: see :func:`get_drill`)."""
    from drill.records.db import read_database
    from drill.records.store import Records
    from drill.storage import normalize

    key = normalize(root) if root else None  # a location no storage can address is refused, recorded drills or not
    database = read_database(db)
    if database is None:
        return []
    try:
        return Records(database).history(run_root=key, limit=limit, since=since, status=status, policy=policy)
    finally:
        database.close()


def get_drill(drill_id: int, *, db: str | None = None) -> DrillOutcome:
    """One recorded drill with every check's evidence; :class:`~drill.errors.NotFound` if none."""
    from drill.errors import NotFound
    from drill.records.db import read_database
    from drill.records.store import Records

    database = read_database(db)
    if database is None:
        raise NotFound(f"no drill with id {drill_id} (no drills recorded yet)")
    try:
        return Records(database).get(drill_id)
    finally:
        database.close()


def bursts(*, db: str | None = None, root: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Recorded restore bursts (``drill burst``), newest first: their documents."""
    from drill.records.db import read_database
    from drill.records.store import Records
    from drill.storage import normalize

    key = normalize(root) if root else None
    database = read_database(db)
    if database is None:
        return []
    try:
        return Records(database).bursts(key, limit=limit)
    finally:
        database.close()


def get_burst(burst_id: int, *, db: str | None = None) -> dict[str, Any]:
    """One recorded restore burst; :class:`~drill.errors.NotFound` if none."""
    from drill.errors import NotFound
    from drill.records.db import read_database
    from drill.records.store import Records

    database = read_database(db)
    if database is None:
        raise NotFound(f"no burst #{burst_id}: the database holds no records yet")
    try:
        return Records(database).burst(burst_id)
    finally:
        database.close()


def last_good(
    root: str,
    *,
    db: str | None = None,
    min_evidence: str = "structural",
    require_replay: bool = False,
    timeout: float | None = 300.0,
    broken: list[DrillOutcome] | None = None,
) -> DrillOutcome | None:
    """The newest retained checkpoint under ``root`` whose latest drill passed on at least
    ``min_evidence`` (see :mod:`drill.claims`), and replayed when ``require_replay``. A drill
    whose record fails its audit seal vouches for nothing: newer checkpoints whose latest
    record does are passed over (and added to ``broken``, when given).

    Listing the run is bounded by ``timeout`` (a storage that never answers); a root that is
    not there is :class:`~drill.errors.NothingToDrill`, storage that refuses or fails is
    :class:`~drill.errors.StorageProblem`."""
    from drill.records.db import read_database
    from drill.records.store import Records

    key, found = list_run(root, timeout)
    database = read_database(db)
    if database is None:
        return None
    try:
        return Records(database).last_good(
            key,
            [c.uri for c in found.checkpoints],
            min_evidence=min_evidence,
            require_replay=require_replay,
            broken=broken,
        )
    finally:
        database.close()


def list_run(
    root: str, timeout: float | None = 300.0, storage_options: dict[str, Any] | None = None
) -> tuple[str, Discovery]:
    """``(normalized root, Discovery)`` of a run, bounded in time; the one way commands list a
    run (errors: :class:`~drill.errors.NothingToDrill` when it is not there,
    :class:`~drill.errors.StorageProblem` when the storage refuses or fails,
    :class:`~drill.storage.Unaddressable` — a usage error — when no storage can address it)."""
    from drill.discover import discover
    from drill.errors import NothingToDrill, storage_unavailable
    from drill.interrupts import deadline
    from drill.storage import normalize, storage_for

    key = normalize(root)
    try:
        with deadline(timeout, f"listing {key}"):
            return key, discover(storage_for(key, storage_options), key)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NothingToDrill(
            f"run root {root} does not exist or is not a directory ({exc.strerror or exc})",
            hint="check the path; is the checkpoint filesystem mounted on this host?",
        ) from None
    except OSError as exc:
        raise storage_unavailable(key, exc) from None


_CHAIN_HEAD = re.compile(r"[0-9a-f]{64}")
"""A chain head as the log holds it: an entry's SHA-256, in hex."""


def verify_audit_chain(
    *, db: str | None = None, head: str | None = None, keyed_from: int | None = None, workers: int | None = None
) -> ChainReport:
    """Check the tamper-evident drill log, all of it: every link, every entry, every closed
    record's digest, and — with ``head`` (a chain head an auditor pinned) — that the log still
    reaches it. The audit key, when ``$DRILL_AUDIT_KEY_FILE``/``$DRILL_AUDIT_KEY`` holds one, must
    have sealed every entry (from entry ``keyed_from`` on, when the key was introduced later).
    ``workers`` processes recompute the records' digests (default: every core this process may use).

    The pass is recorded (intact or not) where the database can be written: what ``drill
    metrics`` reports without verifying on a scrape. Raises :class:`~drill.errors.UsageError`
    when the key cannot be used, or when ``head`` cannot be a chain head at all."""
    from drill.errors import UsageError
    from drill.records.audit import ChainReport, record_pass, verify_chain
    from drill.records.db import read_database
    from drill.records.store import Records

    if head is not None and not _CHAIN_HEAD.fullmatch(head.strip().lower()):
        raise UsageError(
            f"--head {head!r} is not a chain head: 64 hex digits, as drill audit verify prints it (a malformed pin proves nothing about the log)"
        )
    key = audit_key()
    database = read_database(db)
    if database is None:
        report = ChainReport()
        if head is not None:
            report = _no_database_for(head)
        return report
    try:
        with Records(database)._session() as session:
            report = verify_chain(session, key=key, head=head, keyed_from=keyed_from, workers=workers)
    finally:
        database.close()
    _record_pass(db, lambda s: record_pass(s, report, key))
    return report


def _record_pass(db: str | None, write: Any) -> None:
    """Record the pass where the database can be written (a read-only replica or file keeps
    none: the metrics then say no pass was recorded)."""
    from drill.errors import DatabaseError
    from drill.records.db import open_database
    from drill.records.store import Records

    try:
        database = open_database(db)
    except DatabaseError:
        return
    try:
        with Records(database)._session() as s:
            write(s)
    except DatabaseError:
        pass
    finally:
        database.close()


def audit_key() -> bytes | None:
    """The configured audit key; a :class:`~drill.errors.UsageError` when one is configured and
    cannot be used — drill then refuses to record rather than seal without it."""
    from drill.errors import UsageError
    from drill.integrity.keys import SealKeyError
    from drill.records.audit import load_audit_key

    try:
        return load_audit_key()
    except SealKeyError as exc:
        raise UsageError(
            str(exc), hint="fix $DRILL_AUDIT_KEY_FILE / $DRILL_AUDIT_KEY, or unset them to record without HMACs"
        ) from None


def _no_database_for(head: str) -> ChainReport:
    from drill.findings import Finding, Severity
    from drill.records.audit import ChainReport

    problem = Finding(
        check="audit",
        code="head-missing",
        severity=Severity.ERROR,
        subject=head,
        message=f"the pinned chain head {head} is not in the chain: no drills are recorded at all",
    )
    return ChainReport(problems=[problem])


__all__ = [
    "bursts",
    "dry_run",
    "get_burst",
    "get_drill",
    "history",
    "last_good",
    "list_run",
    "run_drill",
    "run_policy",
    "verify_audit_chain",
]
