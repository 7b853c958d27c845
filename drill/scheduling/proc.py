"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import ctypes
import resource
import signal

PR_SET_PDEATHSIG = 1


def child_preexec(memory: int | None = None):  # type: ignore[no-untyped-def]
    """In the child, before exec: die with the parent; cap the address space."""

    def setup() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass  # not Linux: the scheduler's restart still recovers orphaned drills
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return setup
