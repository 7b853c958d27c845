"""The drill's place in a distributed job: its rank, the world, and its own process group.

drill runs as every rank of a job that torchrun, srun or a Kubernetes indexed Job started; it
never launches ranks itself. The rank and world size come from the launcher's environment
(``RANK``/``WORLD_SIZE`` from torchrun or a Job, ``SLURM_PROCID``/``SLURM_NTASKS`` from srun);
the rendezvous is ``$DRILL_DIST_INIT`` (``file:///shared/path``: nothing listens on a port)
or, without it, ``env://`` (``MASTER_ADDR``/``MASTER_PORT``).

drill's collectives move only small Python objects (per-rank reports, the plan, the verdict),
so they run on a gloo group of drill's own — also on GPU nodes, and also when the process
group of the trainer that embeds drill already exists.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from drill.errors import DrillError, ExitCode, UsageError

INIT_ENV = "DRILL_DIST_INIT"
DEFAULT_RANK_TIMEOUT = 600.0


class RankFailure(DrillError):
    """A rank did not take part in a collective, or failed its share: the drill is an ``error``."""

    exit_code = ExitCode.ERROR

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


def launched_world() -> tuple[int, int] | None:
    """(rank, world size) when a launcher started this process as one of several ranks."""
    env = os.environ
    for rank_var, world_var in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if env.get(world_var):
            try:
                world, rank = int(env[world_var]), int(env.get(rank_var, "0"))
            except ValueError:
                raise UsageError(f"${world_var}={env[world_var]!r} / ${rank_var}={env.get(rank_var)!r}: not a rank and world size") from None
            if world > 1:
                if not 0 <= rank < world:
                    raise UsageError(f"rank {rank} is outside a world of {world}")
                return rank, world
            return None
    return None


@dataclass(slots=True)
class DistContext:
    rank: int
    world: int
    group: Any
    store: Any
    timeout: float
    owns_default: bool
    """drill initialized the default process group (and destroys it when done)."""

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # -- collectives ------------------------------------------------------------------------
    def broadcast(self, obj: Any, stage: str) -> Any:
        """``obj`` from rank 0, on every rank; names the ranks that never reached ``stage``."""
        import torch.distributed as dist

        self.mark(stage)
        box = [obj if self.is_root else None]
        self._collective(stage, lambda: dist.broadcast_object_list(box, src=0, group=self.group))
        return box[0]

    def gather(self, obj: Any, stage: str) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere); names the ranks that never sent."""
        import torch.distributed as dist

        self.mark(stage)
        out: list[Any] | None = [None] * self.world if self.is_root else None
        self._collective(stage, lambda: dist.gather_object(obj, out, dst=0, group=self.group))
        return out

    def _collective(self, what: str, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - gloo reports a dead or hung peer as a RuntimeError
            missing = self.missing(what)
            who = f"rank(s) {', '.join(map(str, missing))}" if missing else "a rank"
            raise RankFailure(
                f"{who} did not reach '{what}' within {self.timeout:g} s: died, hung or was killed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                missing,
            ) from None

    # -- the store: who got how far ---------------------------------------------------------
    def mark(self, stage: str) -> None:
        self.store.set(f"drill/{stage}/{self.rank}", "1")

    def missing(self, stage: str) -> list[int]:
        return [r for r in range(self.world) if not self.store.check([f"drill/{stage}/{r}"])]

    def publish(self, key: str, value: Any) -> None:
        self.store.set(f"drill/{key}", pickle.dumps(value))

    def wait_for(self, key: str, timeout: float) -> Any:
        """A value rank 0 published; RankFailure when it does not come within ``timeout``."""
        try:
            self.store.wait([f"drill/{key}"], timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - the store raises on timeout or when rank 0's store went away
            raise RankFailure(f"rank 0 did not publish '{key}' within {timeout:g} s: it died or hung", [0]) from None
        return pickle.loads(self.store.get(f"drill/{key}"))  # noqa: S301 - written by rank 0 of this very job

    def close(self) -> None:
        import torch.distributed as dist

        if self.owns_default and dist.is_initialized():
            dist.destroy_process_group()


def connect(rank_timeout: float = DEFAULT_RANK_TIMEOUT) -> DistContext | None:
    """Join the job this process is a rank of; None for a single-process drill."""
    import torch.distributed as dist

    launched = launched_world()
    owns = False
    if not dist.is_initialized():
        if launched is None:
            return None
        rank, world = launched
        init = os.environ.get(INIT_ENV) or "env://"
        if init == "env://" and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
            raise UsageError(f"rank {rank} of {world}: set ${INIT_ENV} (file:///shared/dir/rendezvous) or MASTER_ADDR and MASTER_PORT")
        kw: dict[str, Any] = {"backend": "gloo", "init_method": init, "timeout": timedelta(seconds=rank_timeout)}
        if init != "env://":
            kw.update(rank=rank, world_size=world)
        dist.init_process_group(**kw)
        owns = True
    elif dist.get_world_size() <= 1:
        return None
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=rank_timeout))
    from torch.distributed.distributed_c10d import _get_default_store

    return DistContext(dist.get_rank(), dist.get_world_size(), group, _get_default_store(), rank_timeout, owns)


__all__ = ["DEFAULT_RANK_TIMEOUT", "INIT_ENV", "DistContext", "RankFailure", "connect", "launched_world"]
