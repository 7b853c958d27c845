"""Run the ``drill`` CLI with a pause at one phase, for tests that interrupt a real drill.

    python -m tests.support.drive PHASE MARKER -- drill-arguments…

At PHASE the process writes MARKER and waits (the test then signals it) — or, with
``$DRILL_TEST_RELEASE`` naming a file, until that file exists, and then goes on. ``read`` pauses
inside DCP's load, on a reader thread, as a slow mount would; ``open-db`` pauses before the
drill has a record; ``replay`` marks the start of the replay and does not pause (the replay
child runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start(phase: str, marker: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``drill run args…`` in a subprocess that pauses at ``phase`` (see above)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.drive", phase, str(marker), "--", "run", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def wait_for(marker: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the driven drill has reached its phase (it wrote ``marker``)."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the drill never reached the phase"
        time.sleep(0.05)


def main() -> None:
    phase, marker = sys.argv[1], Path(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1 :]

    release = os.environ.get("DRILL_TEST_RELEASE")

    def arrive(hold: bool = True) -> None:
        marker.write_text(phase)
        if hold and release:  # hold until the test says go on
            deadline = time.monotonic() + 120
            while not Path(release).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        elif hold:
            time.sleep(60)

    import drill.cli.progress as progress
    import drill.records.db as db

    class Pausing(progress.RichProgress):
        def phase(self, name: str, total_bytes: int | None = None) -> None:
            super().phase(name, total_bytes)
            if name == phase and phase != "read":
                arrive(hold=phase != "replay")

        def advance(self, nbytes: int) -> None:
            if phase == "read":
                arrive()

    progress.RichProgress = Pausing
    if phase == "open-db":
        real = db.open_database

        def slow_open(url=None):
            arrive()
            return real(url)

        db.open_database = slow_open
    from drill.cli.app import main as drill_main

    sys.argv = ["drill", *args]
    drill_main()


if __name__ == "__main__":
    main()
