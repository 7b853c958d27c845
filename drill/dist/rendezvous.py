"""Where the ranks of one drill meet: a key-value store, and a key space for this attempt only.

drill's ranks never open connections to each other. They meet in one store:

- ``$DRILL_DIST_INIT=file:///shared/dir/name`` — a :class:`~torch.distributed.FileStore` on a
  filesystem every node sees (nothing listens on a port; right for small jobs);
- otherwise ``env://`` — a :class:`~torch.distributed.TCPStore` at ``MASTER_ADDR:MASTER_PORT``,
  hosted by torchrun's agent when torchrun runs the ranks, else by rank 0. Every rank holds one
  connection to it: a drill of N ranks opens N connections, not the N·(N−1)/2 of a gloo mesh.

Every key lives under a prefix unique to this attempt (:func:`attempt_prefix`): the launcher's
run id and restart count, so a second torchrun attempt (``--max-restarts``) or a later job that
reuses a rendezvous path never reads what an earlier one left.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from drill.dist.failure import RankFailure
from drill.errors import UsageError
from drill.units import bounded_wait

INIT_ENV = "DRILL_DIST_INIT"


def attempt_prefix() -> str:
    """``drill/<run>/<attempt>/``: the launcher's job or run id and its restart count."""
    env = os.environ
    run = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or env.get("JOB_NAME") or "job"
    attempt = env.get("TORCHELASTIC_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT") or "0"
    return f"drill/{run}/{attempt}/"


def store_address() -> str:
    """The store this process meets the others in, as another process would open it:
    ``file:///path`` or ``tcp://host:port`` (a distributed replay's ranks meet there too)."""
    init = os.environ.get(INIT_ENV) or "env://"
    if init.startswith("file://"):
        return f"file://{urlparse(init).path}"
    return f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '0')}"


def where() -> str:
    """The rendezvous this process would use, in words (for messages)."""
    init = os.environ.get(INIT_ENV)
    if init:
        return init
    return f"env://{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def store_host() -> str:
    """Who hosts the store this process meets the others in, in words (for messages)."""
    init = os.environ.get(INIT_ENV)
    if init and init.startswith("file://"):
        return f"the file store at {urlparse(init).path}"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return f"torchrun's agent at {os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    return "rank 0"


def open_store(rank: int, world: int, timeout: float) -> tuple[Any, bool]:
    """This attempt's store, as seen by ``rank`` of ``world``, and whether this process hosts
    it (then it must outlive the other ranks' last read); :class:`UsageError` when the
    environment names no usable rendezvous."""
    import torch.distributed as dist

    init = os.environ.get(INIT_ENV) or "env://"
    if init.startswith("file://"):
        path = urlparse(init).path
        if not path or not os.path.isdir(os.path.dirname(path) or "/"):
            raise UsageError(f"${INIT_ENV}={init}: the directory of the rendezvous file does not exist on this node")
        store, hosts = dist.FileStore(path, -1), False
        store.set_timeout(timedelta(seconds=bounded_wait(timeout)))
    elif init == "env://":
        store, hosts = _tcp_store(rank, world, timeout)
    else:
        raise UsageError(f"${INIT_ENV}={init}: expected file:///shared/dir/rendezvous (or unset, for env://)")
    return dist.PrefixStore(attempt_prefix(), store), hosts


def _tcp_store(rank: int, world: int, timeout: float) -> tuple[Any, bool]:
    import torch.distributed as dist

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (addr and port and port.isdigit()):
        raise UsageError(
            f"rank {rank} of {world}: set ${INIT_ENV} (file:///shared/dir/rendezvous) or MASTER_ADDR and MASTER_PORT"
        )
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"  # torchrun's agent hosts it
    hosts = rank == 0 and not agent
    listener = _listen(addr, int(port)) if hosts else None
    try:
        store = dist.TCPStore(
            addr, int(port), None, is_master=hosts, timeout=timedelta(seconds=bounded_wait(timeout)), wait_for_workers=False, multi_tenant=True,
            master_listen_fd=listener.fileno() if listener is not None else None,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - c10d raises RuntimeError subclasses for every socket problem
        who = "rank 0 (or torchrun's agent)" if rank != 0 or agent else "this rank"
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise RankFailure(
            f"rank {rank} could not reach the rendezvous at {addr}:{port} within {timeout:g} s: {who} never opened it ({first})",
            [0],
        ) from None
    _LISTENERS.append(listener)
    return store, hosts


_LISTENERS: list[Any] = []
"""Sockets the store this process hosts listens on (kept open as long as the process lives)."""


def _listen(addr: str, port: int) -> socket.socket:
    """The store's listening socket, bound to ``MASTER_ADDR`` only — never every interface (c10d's
    own default)."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(4096)
        return sock
    except OSError as exc:
        raise UsageError(
            f"rank 0 cannot listen on MASTER_ADDR={addr} port {port} ({exc.strerror or exc}): is that an address of this node?"
        ) from None


__all__ = ["INIT_ENV", "attempt_prefix", "open_store", "store_host", "where"]
