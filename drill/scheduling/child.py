"""The isolated policy drill's child process: run the pipeline, hand the outcome back.

It receives the policy the parent already validated (never re-reading the file, which may
have changed since), tells the parent its drill id as soon as the record exists, and sends
the outcome document when the drill ends — interrupted ones included.
"""

from __future__ import annotations

import sys
from typing import Any

from drill.errors import DrillError, ExitCode


class _Announcing:
    """A recorder that also tells the parent the drill's id the moment it has one."""

    def __init__(self, inner: Any, conn: Any) -> None:
        self._inner = inner
        self._conn = conn

    def begin(self, start: Any) -> int | None:
        drill_id = self._inner.begin(start)
        self._conn.send(("begun", drill_id))
        return drill_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main(fd: int) -> int:
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    policy, db_url, trigger = conn.recv()
    try:
        from drill.pipeline import run_drill
        from drill.policy.request import request_from_policy
        from drill.records.db import open_database
        from drill.records.recorder import DatabaseRecorder

        request = request_from_policy(policy, trigger)
        database = open_database(db_url)
    except DrillError as exc:
        conn.send(("refused", int(exc.exit_code), exc.message))
        return int(exc.exit_code)
    try:
        outcome = run_drill(request, _Announcing(DatabaseRecorder(database), conn))
    except DrillError as exc:
        conn.send(("refused", int(exc.exit_code), exc.message))
        return int(exc.exit_code)
    finally:
        database.close()
    conn.send(("outcome", outcome.to_document(), outcome.record_problem))
    return int(outcome.exit_code)


def _main() -> int:
    """The parent gone (stopped, killed), there is no one to hand the outcome to: end quietly,
    not with a traceback on the terminal the parent shared. The drill's record is the
    pipeline's to close."""
    try:
        return main(int(sys.argv[1])) if len(sys.argv) > 1 else int(ExitCode.USAGE)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return int(ExitCode.ERROR)


if __name__ == "__main__":
    sys.exit(_main())
