"""Verdicts that could not be written to the database, kept on local disk until they can.

When even closing a drill's row as ``error`` fails (the database is locked past every retry,
down, or its disk is full), the finished drill's outcome document is written here — one
file per drill, fsync'd, readable by its owner only — and the next drill (or ``drill db
flush``) delivers it. A file names the database it belongs to by a hash of its URL (without
password: :func:`~drill.records.urls.database_key`, computed without SQLAlchemy so that a
trainer's host spools a resume without importing it), so two databases never receive each
other's drills.

The spool is trusted only as far as it is provably drill's own: a file is delivered only if
it is a regular file (not a link) owned by this user and readable by nobody else, in a
directory of the same kind — a verdict planted by another user is never delivered as a passed
drill. A delivery first *claims* its file (an atomic rename to ``…json.claimed-<pid>``), so two
flushes at once deliver it once; a claim left by a process that died is taken over. Files that
cannot be delivered — foreign, corrupt, not an outcome document — stay where they are and are
reported (:attr:`Pending.rejected`), never skipped silently.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

SPOOL_ENV = "DRILL_SPOOL_DIR"

SAVE_KIND = "save"
"""``"kind"`` of a save's document (a drill's outcome document, the spool's other kind, has none)."""

SAVE_VERSION = 1
"""The shape of a save's document (its ``version`` field); a newer one waits in the spool for a
newer drill to deliver it."""

SAVE_FIELDS = (
    "checkpoint",
    "run_root",
    "step",
    "method",
    "files",
    "bytes",
    "hash_seconds",
    "save_seconds",
    "bytes_read_back",
    "keyed",
    "host",
    "pid",
    "saved_at",
    "drill_version",
)


def is_save(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == SAVE_KIND


_CLAIMED = ".claimed-"


def spool_dir() -> Path:
    """``$DRILL_SPOOL_DIR``, else ``$XDG_STATE_HOME/drill/spool`` (``~/.local/state/drill/spool``)."""
    explicit = os.environ.get(SPOOL_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "drill" / "spool"


@dataclass(slots=True)
class Pending:
    """This database's spooled verdicts: claimable ones, and the files that will never be."""

    documents: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    rejected: dict[Path, str] = field(default_factory=dict)
    """File → why it is not delivered (foreign owner or mode, not JSON, not an outcome)."""


class Spool:
    """One database's spooled documents. ``db_key`` names the database (:func:`~drill.records.urls.database_key`
    of its URL); ``aliases``: other names older drills spooled its documents under, delivered too."""

    def __init__(self, db_key: str, directory: Path | None = None, aliases: tuple[str, ...] = ()) -> None:
        self.directory = directory or spool_dir()
        self.key = xxhash.xxh3_64_hexdigest(db_key.encode())
        self._keys = [self.key] + [k for k in (xxhash.xxh3_64_hexdigest(a.encode()) for a in aliases) if k != self.key]

    def put(self, document: dict[str, Any]) -> Path:
        """Keep one finished drill's outcome document; returns where."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{self.key}-{document.get('id') or 'new'}-{os.getpid()}-{time.time_ns()}.json"
        path = self.directory / name
        tmp = self.directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(document, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return path

    def pending(self) -> Pending:
        """This database's spooled outcomes, oldest first, and the files that are refused."""
        out = Pending()
        why = _not_ours(self.directory, directory=True) if self.directory.exists() else None
        if not self.directory.is_dir():
            return out
        files = sorted(p for key in self._keys for p in self.directory.glob(f"{key}-*.json")) + sorted(
            self._abandoned()
        )
        for path in files:
            problem = why or _not_ours(path)
            if problem is None:
                try:
                    doc = json.loads(path.read_text(encoding="utf-8"))
                    problem = None if isinstance(doc, dict) else "not an outcome document (not a JSON object)"
                except (OSError, UnicodeDecodeError, ValueError) as exc:
                    problem = f"not readable as JSON ({type(exc).__name__})"
            if problem is not None and not os.path.lexists(path):
                continue  # claimed (renamed) by a concurrent flush since it was listed: not ours to judge
            if problem is None:
                out.documents.append((path, doc))
            else:
                out.rejected[path] = problem
        return out

    def _abandoned(self) -> list[Path]:
        """Claims whose process is gone: they were never delivered (or delivered and not yet
        unlinked, which delivery recognizes), so they are taken over."""
        out = []
        for path in (p for key in self._keys for p in self.directory.glob(f"{key}-*.json{_CLAIMED}*")):
            pid = path.name.rsplit(_CLAIMED, 1)[1]
            if pid.isdigit() and not _alive(int(pid)):
                out.append(path)
        return out

    @staticmethod
    def claim(path: Path) -> Path | None:
        """Take ``path`` for delivery (an atomic rename); None when another process got it first."""
        base = path.name.split(_CLAIMED, 1)[0]
        claimed = path.with_name(f"{base}{_CLAIMED}{os.getpid()}")
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None
        return claimed

    @staticmethod
    def done(path: Path) -> None:
        path.unlink(missing_ok=True)


def _not_ours(path: Path, *, directory: bool = False) -> str | None:
    """Why ``path`` is not provably this user's own spool entry; None when it is."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    kind = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind:
        return "a link or special file, not a spool " + ("directory" if directory else "file")
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): planted by someone else"
    if st.st_mode & (0o022 if directory else 0o077):
        return f"mode {stat.S_IMODE(st.st_mode):04o}: {'writable' if directory else 'readable or writable'} by other users, so anyone could have written it"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def spool_record(document: dict[str, Any], db: str | None) -> Path | None:
    """Spool a record written on a trainer's host (a resume's outcome, a save's document) for
    the database ``db`` names (``$DRILL_DATABASE_URL``, the embedded default): a file, no
    database layer imported. Never raises: None when it could not be written."""
    from drill.records.urls import database_key, resolve_url

    try:
        return Spool(database_key(resolve_url(db))).put(document)
    except Exception:  # noqa: BLE001 - nothing may reach the trainer from here
        return None
