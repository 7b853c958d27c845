"""Errors a user can act on, each mapped to one documented exit code.

Anything else that escapes is a bug in drill and exits with ``INTERNAL``.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes; what each means is :data:`EXIT_MEANINGS` (``drill --help`` and
    ``docs/cli.md`` say it)."""

    PASSED = 0
    FAILED = 1
    USAGE = 2
    NOTHING_TO_DRILL = 3
    DATABASE = 4
    ERROR = 5
    SLO_BREACH = 6
    LOCKED = 7
    UNPROVEN = 8
    INTERNAL = 70
    INTERRUPTED = 130
    TERMINATED = 143


EXIT_MEANINGS: dict[ExitCode, str] = {
    ExitCode.PASSED: "the drill passed",
    ExitCode.FAILED: "the drill failed: a check found a problem (recorded); `drill audit verify`: the log is not intact; `drill db flush`: a spooled file cannot be delivered",
    ExitCode.USAGE: "usage error: bad option or argument (a blank one too: never the working directory); nothing read, nothing recorded",
    ExitCode.NOTHING_TO_DRILL: "nothing to drill: root missing, nothing retained, or the step is not retained (not recorded); a run of only unfinished saves (recorded as a failed drill with a `discover` finding)",
    ExitCode.DATABASE: "the database cannot be reached, or its schema is behind (run `drill db upgrade`) or ahead, or it holds a record drill cannot read (a row edited outside drill: a time that is not a time, an unknown status, broken JSON)",
    ExitCode.ERROR: "error: the drill could not finish for a reason outside the checkpoint — drill's own (recorded as `error` with the traceback) or the storage's: credentials, permissions, an endpoint away, a listing past its timeout (before a drill began: not recorded); or the command's output could not be written (a full disk, a pipe whose reader stopped)",
    ExitCode.SLO_BREACH: "SLO breach: every check passed, but restore latency or time to first step missed the policy's target (recorded as `slo_breach`)",
    ExitCode.LOCKED: "another scheduler holds the database's scheduler lease",
    ExitCode.UNPROVEN: "`drill verify`: unproven — no seal and no structural proof its format allows; nothing about the bytes was proven",
    ExitCode.INTERNAL: "internal error: a bug in drill; `--debug` shows the traceback",
    ExitCode.INTERRUPTED: "interrupted by SIGINT (recorded as `aborted` if the drill had begun its record)",
    ExitCode.TERMINATED: "stopped by SIGTERM (recorded as `aborted` if the drill had begun its record)",
}
"""Exit code → what it means, in full (the reference's table)."""


class DrillError(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(DrillError):
    exit_code = ExitCode.USAGE


def named(location: str, example: str) -> str:
    """``location`` (a path or URI the user gave), or a :class:`UsageError` when it is blank:
    an empty path would be the working directory, never what was meant."""
    if not location.strip():
        raise UsageError(f"no location given (an empty path would be the working directory): {example}")
    return location


class NothingToDrill(DrillError):
    exit_code = ExitCode.NOTHING_TO_DRILL


class DatabaseError(DrillError):
    exit_code = ExitCode.DATABASE
    transient: bool = False
    """Worth retrying: a lock held past the busy timeout, a dropped connection."""


class UnreadableRecord(DatabaseError):
    """A row holds a value drill cannot turn back into a record (edited outside drill)."""


class IntegrityConflict(DrillError):
    """The checkpoint no longer matches the manifest that seals it."""

    exit_code = ExitCode.FAILED


class NotFound(DrillError):
    """A record asked for by id does not exist."""

    exit_code = ExitCode.USAGE


class StorageProblem(DrillError):
    """The storage could not be reached or refused drill (credentials, permissions, an endpoint
    away, retries exhausted): infrastructure, never a verdict on the checkpoint (exit 5)."""

    exit_code = ExitCode.ERROR


def storage_unavailable(uri: str, exc: BaseException) -> DrillError:
    """The one-line error for a storage that would not serve ``uri`` — or, where the failure
    already is a :class:`DrillError` (a location no storage can address: what was typed), that
    error itself."""
    if isinstance(exc, DrillError):
        return exc
    why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    hint = (
        "check the credentials drill runs with (boto3's chain: environment, profile, instance role) and s3:ListBucket + s3:GetObject"
        if isinstance(exc, PermissionError)
        else "is the storage reachable from this host? the drill was not recorded: nothing about the checkpoint was learned"
    )
    return StorageProblem(f"storage unavailable: {uri}: {why}", hint=hint)


class OutputUnwritable(DrillError):
    """The command's output could not be written — stdout on a full disk, a pipe whose reader
    stopped reading: never taken for the pass or failure the output was to say (exit 5)."""

    exit_code = ExitCode.ERROR


class ResourceLimit(DrillError):
    """The drill cannot be done on this host (the restored state would not fit its memory)."""

    exit_code = ExitCode.ERROR


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how drill names an exception in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
