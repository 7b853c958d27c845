"""A replay child that does not pay the interpreter's start-up again.

A fresh interpreter spends about as long importing torch as the replay itself takes on a small
run. So, where it is safe, the drill forks the replay's child-to-be as soon as torch is
imported — before any thread, OpenMP pool or CUDA context exists in the drill (forking a
process whose OpenMP pool has run hangs the child's first parallel region; forking after CUDA
is initialized is refused by CUDA). The fork waits, idle, on a pipe; when the replay is due it
receives its arguments and import path and runs :mod:`drill.replay.child` as a fresh child
would, sending the same JSON messages back. If the drill never replays, closing the pipe ends
it; it dies with the drill in any case (``PR_SET_PDEATHSIG``).

Only a process that knows nothing has run in it yet may :func:`prepare` one (the ``drill``
command, see :func:`drill.proc.claim_process`); a library call, a test runner, a scheduler
thread, and any process with a second thread get a fresh interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import NoReturn

_prepared: Zygote | None = None


class ForkedChild:
    """The running replay child, with the part of :class:`subprocess.Popen`'s interface the
    replay uses (``poll``, ``wait``, ``kill``, ``returncode``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL  # reaped elsewhere: gone, cause unknown
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Zygote:
    """The forked child-to-be, seen from the drill: a request pipe to it, a result pipe from it."""

    def __init__(self, pid: int, request_fd: int, result_fd: int) -> None:
        self.child = ForkedChild(pid)
        self.request_fd, self.result_fd = request_fd, result_fd

    @classmethod
    def fork(cls) -> Zygote | None:
        """Fork one now, or None where a fork is not safe (another thread is running, CUDA is
        initialized, not Linux: macOS's frameworks do not survive a fork)."""
        import torch

        from drill.proc import death_signal, may_fork

        if not may_fork() or torch.cuda.is_initialized():
            return None
        death_signal()  # resolved before the fork, not in the child
        request_r, request_w = os.pipe()
        result_r, result_w = os.pipe()
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the forked child; it reports over the result pipe
            os.close(request_w)
            os.close(result_r)
            _serve(request_r, result_w, parent)
        os.close(request_r)
        os.close(result_w)
        return cls(pid, request_w, result_r)

    def launch(self, args: list[str], path: list[str]) -> tuple[ForkedChild, int]:
        """Make it the replay child: ``args`` as :mod:`drill.replay.child` takes them after its
        result descriptor, ``path`` its import path. Returns its handle and the descriptor its
        messages arrive on (the caller's to close)."""
        payload = json.dumps({"args": args, "path": path}).encode()
        try:
            with os.fdopen(self.request_fd, "wb") as pipe:
                pipe.write(payload)
        except OSError:
            pass  # it died while waiting: the result pipe's EOF says so
        result_fd, self.request_fd, self.result_fd = self.result_fd, -1, -1
        return self.child, result_fd

    def discard(self) -> None:
        """End it unused: it reads the closed pipe and exits; killed if it does not at once."""
        if self.request_fd >= 0:
            os.close(self.request_fd)
            self.request_fd = -1
            try:
                self.child.wait(2)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
        if self.result_fd >= 0:
            os.close(self.result_fd)
            self.result_fd = -1


def prepare() -> None:
    """Fork the replay's child-to-be now, if it is safe; the next replay in this process uses
    it. Call only where no torch operation has run yet in this process."""
    global _prepared
    if _prepared is None:
        _prepared = Zygote.fork()
        if _prepared is not None:
            atexit.register(_discard_prepared)


def take() -> Zygote | None:
    """The prepared child-to-be, once; None when there is none."""
    global _prepared
    zygote, _prepared = _prepared, None
    return zygote


def _discard_prepared() -> None:
    zygote = take()
    if zygote is not None:
        zygote.discard()


def _serve(request_fd: int, result_fd: int, parent: int) -> NoReturn:  # pragma: no cover - runs in the fork
    code = 1
    try:
        _detach(parent)
        request = _read_request(request_fd)
        if request is None:
            os._exit(0)  # the drill ended without a replay
        sys.path[:] = request["path"]
        sys.argv[:] = ["drill.replay.child", *request["args"]]  # not the drill's (a --db URL may hold a password)
        from multiprocessing.connection import Connection

        from drill.replay.child import main

        entry, trust, run, ckpt, dev, k, opts, *world = request["args"]
        main(
            Connection(result_fd, readable=False), entry, trust, run, ckpt, dev, int(k), json.loads(opts),
            json.loads(world[0]) if world else None,
        )  # fmt: skip
        code = 0
    except BaseException:  # noqa: BLE001 - the drill learns of it from the closed result pipe
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _detach(parent: int) -> None:
    """Die with the drill; the drill's signal handlers are not the child's; nothing to read on
    stdin, and the trainer's prints go to stderr (stdout carries the drill's data)."""
    from drill.proc import die_with_parent

    die_with_parent(parent)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    try:
        os.dup2(sys.stderr.fileno(), 1)
    except (AttributeError, OSError, ValueError):
        os.dup2(null, 1)  # stderr has no descriptor: the prints go nowhere, never onto stdout
    os.close(null)


def _read_request(fd: int) -> dict | None:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks)) if chunks else None
