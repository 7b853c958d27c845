"""One live PostgreSQL, shared by every copy of the suite on this machine.

A test that stops and starts the server (tests/test_hardening.py) must not do so under another
copy's test that is talking to it — the suite is run beside itself on a loaded machine. Every
test that uses the server holds this file lock shared; the one that restarts it holds it
exclusively, so it waits for the others' current tests and they wait for the restart.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "drill-tests-postgres.lock"


@contextmanager
def holding(*, exclusive: bool) -> Iterator[None]:
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock
