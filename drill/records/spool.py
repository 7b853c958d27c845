"""Verdicts that could not be written to the database, kept on local disk until they can.

When even closing a drill's row as ``error`` fails (the database is locked past every retry,
down, or its disk is full), the finished drill's outcome document is written here — one
file per drill, fsync'd, readable by its owner only — and the next drill (or ``drill db
flush``) delivers it. A file names the database it belongs to by a hash of its URL (without
password), so two databases never receive each other's drills.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import xxhash

SPOOL_ENV = "DRILL_SPOOL_DIR"


def spool_dir() -> Path:
    """``$DRILL_SPOOL_DIR``, else ``$XDG_STATE_HOME/drill/spool`` (``~/.local/state/drill/spool``)."""
    explicit = os.environ.get(SPOOL_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "drill" / "spool"


class Spool:
    def __init__(self, db_key: str, directory: Path | None = None) -> None:
        self.directory = directory or spool_dir()
        self.key = xxhash.xxh3_64_hexdigest(db_key.encode())

    def put(self, document: dict[str, Any]) -> Path:
        """Keep one finished drill's outcome document; returns where."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{self.key}-{document.get('id') or 'new'}-{os.getpid()}-{time.time_ns()}.json"
        path = self.directory / name
        tmp = self.directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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

    def pending(self) -> list[tuple[Path, dict[str, Any]]]:
        """This database's spooled outcomes, oldest first (unreadable files are left alone)."""
        if not self.directory.is_dir():
            return []
        out = []
        for path in sorted(self.directory.glob(f"{self.key}-*.json")):
            try:
                out.append((path, json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError):
                continue
        return out

    @staticmethod
    def done(path: Path) -> None:
        path.unlink(missing_ok=True)
