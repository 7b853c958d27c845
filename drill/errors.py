"""Errors a user can act on, each mapped to one documented exit code.

Anything else that escapes is a bug in drill and exits with ``INTERNAL``.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes; the CLI documents these in ``drill --help`` and the README."""

    PASSED = 0
    """The drill ran and every check passed."""
    FAILED = 1
    """The drill ran and a check failed: the checkpoint is not (fully) restorable."""
    USAGE = 2
    """Bad option or argument; nothing was read and nothing was recorded."""
    NOTHING_TO_DRILL = 3
    """The root is missing or holds no complete checkpoint matching the request."""
    DATABASE = 4
    """The record database cannot be reached, or its schema is behind or ahead."""
    ERROR = 5
    """The drill could not finish for a reason outside the checkpoint (recorded as ``error``)."""
    SLO_BREACH = 6
    """Every check passed, but restore latency or time to first step missed the policy's SLO."""
    LOCKED = 7
    """Another scheduler holds the database's scheduler lease."""
    UNPROVEN = 8
    """``drill verify``: nothing could be proven — no seal, and no structural proof this format
    allows. Not a pass, and not a failure of the checkpoint."""
    INTERNAL = 70
    """A bug in drill (EX_SOFTWARE); re-run with ``--debug`` for the traceback."""
    INTERRUPTED = 130
    """Interrupted by SIGINT; the drill is recorded as ``aborted``."""
    TERMINATED = 143
    """Stopped by SIGTERM (a scheduler or batch system stopping it); recorded as ``aborted``."""


class DrillError(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(DrillError):
    exit_code = ExitCode.USAGE


class NothingToDrill(DrillError):
    exit_code = ExitCode.NOTHING_TO_DRILL


class DatabaseError(DrillError):
    exit_code = ExitCode.DATABASE


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


def storage_unavailable(uri: str, exc: BaseException) -> StorageProblem:
    """The one-line error for a storage that would not serve ``uri``."""
    why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    hint = (
        "check the credentials drill runs with (boto3's chain: environment, profile, instance role) and s3:ListBucket + s3:GetObject"
        if isinstance(exc, PermissionError)
        else "is the storage reachable from this host? the drill was not recorded: nothing about the checkpoint was learned"
    )
    return StorageProblem(f"storage unavailable: {uri}: {why}", hint=hint)


class ResourceLimit(DrillError):
    """The drill cannot be done on this host (the restored state would not fit its memory)."""

    exit_code = ExitCode.ERROR


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how drill names an exception in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
