"""How a drill command ends: the outcome on stdout, one line on stderr, the verdict file, the exit code."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from drill.cli.common import exit_with, print_json, stderr, stdout
from drill.verdict import DrillStatus

if TYPE_CHECKING:
    from drill.pipeline import DrillOutcome


def leave_verdict(
    path: str | None, drill_id: int | None, status: str, code: int, message: str | None, rank: int | None = None
) -> None:
    """``--verdict-file``: the verdict where a launcher reads it; a path that cannot be written is a warning."""
    if path is None:
        return
    from drill.launch.verdict import VerdictFile, write_verdict

    try:
        write_verdict(path, VerdictFile(drill_id, status, code, message, rank))
    except OSError as exc:
        stderr().print(f"drill: warning: --verdict-file {path}: {exc.strerror or exc}", markup=False)


def report(outcome: DrillOutcome, *, json: bool, where: str | None = None) -> None:
    """The outcome on stdout; one line on stderr when it did not pass; the drill's exit code."""
    from drill.cli.render import render_outcome

    if json:
        print_json(outcome.to_document())
    else:
        render_outcome(stdout(), outcome, where)
    err = stderr()
    if outcome.status is not DrillStatus.PASSED and outcome.message:
        recorded = (
            f" (drill #{outcome.id} recorded as {outcome.status.value})"
            if outcome.id is not None
            else " (nothing was recorded)"
        )
        tail = recorded if outcome.status is DrillStatus.ABORTED else ""
        err.print(f"drill: {outcome.status.value}: {outcome.message}{tail}", markup=False)
    if outcome.record_problem:
        err.print(f"drill: warning: {outcome.record_problem}", markup=False)
    if outcome.status is DrillStatus.ABORTED and sys.stdout is sys.__stdout__:
        # Interrupted: the record is written; reads still in flight (a hung mount) must not
        # hold the process, and interpreter shutdown would wait for them.
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os._exit(int(outcome.exit_code))
    raise exit_with(outcome.exit_code)


__all__ = ["leave_verdict", "report"]
