"""What ``drill submit`` learns of a batch job it followed: how it ended, and whether drill
cancelled it. Shared by the Slurm and Kubernetes launchers."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class JobEnd:
    job_id: str
    state: str
    """The batch system's final state (Slurm's COMPLETED, FAILED, TIMEOUT, …; a Kubernetes Job's
    COMPLETE or FAILED); QUEUE_TIMEOUT when drill gave up waiting, NEVER_RUNS when the batch
    system said the job can never start."""
    exit_code: int | None
    reason: str
    pending_seconds: float
    seconds: float
    host: str | None = None
    """The node the job ran on, when the batch system still knows it."""
    cancelled_by: str | None = None
    """Why drill cancelled the job (an interrupt, a scheduler stopping), if it did."""
    cancelled_on: int | None = None
    """The signal that made drill cancel it: SIGINT (Ctrl-C) or SIGTERM (a stop)."""
    was_running: bool = False
    kind: str = "slurm job"
    """How messages name the job: ``slurm job 12``, ``kubernetes Job drill-x-ab12cd``."""

    @property
    def name(self) -> str:
        return f"{self.kind} {self.job_id}"


class Interrupted(Exception):
    """drill submit was interrupted while it followed the job; the job was cancelled (``end``)."""

    def __init__(self, end: JobEnd, cause: BaseException) -> None:
        super().__init__(end.cancelled_by)
        self.end, self.cause = end, cause
        self.submission: object = None


class Job(Protocol):
    """A submitted job, as :func:`follow` sees it."""

    job_id: str
    kind: str

    def state(self) -> tuple[str, str] | None:
        """(PENDING or RUNNING or the system's own word, its reason) while the job lives; None once it ended."""
        ...

    def never_runs(self, reason: str) -> bool:
        """The pending reason says the job as asked can never start."""
        ...

    def cancel(self) -> None: ...

    def final(self) -> tuple[str, int | None, str, str | None]:
        """(state, exit code, reason, host) of the ended job."""
        ...


def follow(job: Job, *, queue_timeout: float, poll: float = 1.0, on_state: Any = None, stop: Any = None) -> JobEnd:
    """Follow ``job`` to its end. Cancel it if it waits in the queue past ``queue_timeout``, at
    once if the batch system says it can never run, and when ``stop(state)`` returns a reason
    (a scheduler stopping); an interrupt (Ctrl-C, SIGTERM) cancels it too and raises
    :class:`Interrupted` carrying how it ended."""
    started = queued = time.monotonic()
    pending_for, last, running = 0.0, None, False
    try:
        while (now := job.state()) is not None:
            st, reason = now
            if st != last and on_state is not None:
                on_state(st, reason)
            if st == "PENDING" and last not in (None, "PENDING"):
                queued = time.monotonic()  # requeued: the queue timeout counts from here
            last, running = st, running or st not in ("PENDING", "CONFIGURING")
            if st == "PENDING":
                pending_for = time.monotonic() - queued
                never = job.never_runs(reason)
                if never or pending_for > queue_timeout:
                    job.cancel()
                    why = "can never run as asked" if never else f"still pending after {queue_timeout:g} s"
                    return JobEnd(
                        job.job_id,
                        "NEVER_RUNS" if never else "QUEUE_TIMEOUT",
                        None,
                        f"{why} ({reason})",
                        pending_for,
                        pending_for,
                        kind=job.kind,
                    )
            stopped: str | None = stop(st) if stop is not None else None
            if stopped:
                return _cancelled(job, stopped, signal.SIGTERM, started, pending_for, running)  # a scheduler stopping
            time.sleep(poll)
    except BaseException as exc:  # Ctrl-C, SIGTERM: the job must not outlive the one following it
        if isinstance(exc, Exception):
            raise
        signum = (
            signal.SIGTERM if "SIGTERM" in str(exc) else signal.SIGINT
        )  # the CLI's Terminated says so; a bare KeyboardInterrupt is Ctrl-C
        end = _cancelled(
            job, f"drill submit was {str(exc) or 'interrupted (SIGINT)'}", signum, started, pending_for, running
        )
        raise Interrupted(end, exc) from None
    st, code, reason, host = job.final()
    return JobEnd(
        job.job_id,
        st,
        code,
        reason,
        pending_for,
        time.monotonic() - started,
        host,
        was_running=running or st != "CANCELLED",
        kind=job.kind,
    )


def _cancelled(job: Job, why: str, signum: int, started: float, pending_for: float, running: bool) -> JobEnd:
    """Cancel the job and follow it out of the queue (a minute at most)."""
    job.cancel()
    deadline = time.monotonic() + 60
    while job.state() is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    st, code, reason, host = job.final()
    return JobEnd(
        job.job_id,
        st,
        code,
        reason,
        pending_for,
        time.monotonic() - started,
        host,
        cancelled_by=why,
        cancelled_on=signum,
        was_running=running,
        kind=job.kind,
    )


__all__ = ["Interrupted", "Job", "JobEnd", "follow"]
