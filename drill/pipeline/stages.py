"""The stages of a drill, and the :class:`Drill` they share.

Each stage is a small function ``(Drill) -> list[CheckResult]``: it does its part of the work,
leaves what it produced in ``drill.inputs`` for the checks, and returns the checks it ran. A
stage that makes the rest pointless (nothing to restore, a path out of the checkpoint) calls
``drill.stop(why)``; the checks of the stages after it are then reported as not run, with
that reason.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from drill import __version__, formats
from drill.checkpoints import CheckpointRef
from drill.checks import CheckInputs
from drill.checks.registry import LOADING_CHECKS, ORDER, STATE_CHECKS, run_checks
from drill.checks.replay import replay_rows
from drill.claims import evidence_of
from drill.device import resolve_device
from drill.discover import discover
from drill.errors import DrillError, ExitCode, NothingToDrill, UsageError, one_line
from drill.failpoints import failpoint
from drill.findings import CheckResult, CheckStatus, not_run
from drill.formats import resolve_format
from drill.formats.base import RestoreContext
from drill.integrity.keys import load_key
from drill.integrity.manifest import MANIFEST_NAME, list_files
from drill.integrity.reading import INFRASTRUCTURE
from drill.integrity.verify import plan_integrity
from drill.interrupts import Interrupted, InterruptGuard
from drill.pipeline import ranks
from drill.pipeline.outcome import CheckpointInfo, DrillOutcome, ReplaySummary, Timings
from drill.pipeline.recorder import DrillStart, Recorder
from drill.pipeline.request import DrillRequest
from drill.replay.run import ERROR, NOT_REPLAYABLE, NOT_RUN, ReplayOutcome, entrypoint_findable, run_replay
from drill.restore import Progress
from drill.select import choose, select
from drill.storage import LocalStorage, Storage, StorageError, scheme_of, storage_for
from drill.verdict import DrillStatus, decide

Stage = Callable[["Drill"], list[CheckResult]]


@dataclass(slots=True)
class Drill:
    """One drill in progress: its request, where it reports, and what it has found so far."""

    request: DrillRequest
    recorder: Recorder
    progress: Progress
    storage: Storage
    device: object
    """The resolved ``torch.device``."""
    inputs: CheckInputs
    outcome: DrillOutcome
    started: float = field(default_factory=time.perf_counter)
    results: dict[str, CheckResult] = field(default_factory=dict)
    stopped: str | None = None
    """Why the remaining stages do not run."""
    drill_error: str | None = None
    replay_error: str | None = None
    restored_step: int | None = None
    """The step the restored train state holds (the replay starts after it)."""
    key: bytes | None = field(default=None, repr=False)
    """The seal key, if one is configured (never recorded)."""
    scratch_copy: str | None = None
    """The local copy of a remote checkpoint, removed when the drill ends."""
    candidate: dict[str, Any] | None = None
    """The candidate environment the replay runs under (``--python``), as probed before the drill began."""
    follows_replay: bool = False
    """A rank other than 0 that restored its share: it runs its rank of a replay rank 0 starts."""
    peers: Any = None
    """Rank 0's :class:`~drill.pipeline.ranks.DrillPeers`, once its replay stage ran."""
    guard: InterruptGuard = field(default_factory=InterruptGuard)
    dist: Any = None
    """The :class:`~drill.dist.context.DistContext` when many ranks run this drill."""
    hash_plan: Any = None
    """What to hash, as rank 0 planned it (the other ranks of a distributed drill)."""

    @classmethod
    def prepare(
        cls, request: DrillRequest, recorder: Recorder, progress: Progress, storage: Storage | None, dist: Any = None
    ) -> Drill:
        """Everything that can be wrong with the request fails here, before anything is
        recorded: a device, storage or key that cannot be used, and what :func:`preflight`
        finds (rank 0 of a distributed drill only: the others follow its choice)."""
        import torch

        assert request.root is not None
        try:
            device = resolve_device(request.device)
            storage = storage or storage_for(request.root, request.storage_options)
            key = load_key(request.key_file)
        except (ValueError, StorageError) as exc:
            raise UsageError(str(exc)) from None
        outcome = DrillOutcome(
            id=None,
            status=DrillStatus.RUNNING,
            exit_code=ExitCode.ERROR,  # until the verdict
            message=None,
            run_root=request.root,
            selector=str(request.selection or request.selector),
            trigger=request.trigger,
            host=socket.gethostname(),
            pid=os.getpid(),
            device=str(device),
            started_at=datetime.now(timezone.utc),
            policy=request.policy,
            versions={"drill": __version__, "torch": torch.__version__},
            sample=str(request.sample),
            job_id=job_id_from_env(),
            options=request.options(),
        )
        inputs = CheckInputs(
            storage=storage,
            root=request.root,
            expectations=request.expectations,
            require_sealed=request.require_sealed,
            durable=request.durable,
            storage_options=request.storage_options,
        )
        drill = cls(request, recorder, progress, storage, device, inputs, outcome)
        drill.key, drill.dist = key, dist
        if dist is None or dist.is_root:
            preflight(drill)
        return drill

    @property
    def timings(self) -> Timings:
        return self.outcome.timings

    def begin(self) -> None:
        o = self.outcome
        start = DrillStart(
            run_root=o.run_root,
            selector=o.selector,
            trigger=o.trigger,
            device=o.device,
            policy=o.policy,
            started_at=o.started_at,
            versions=o.versions,
            job_id=o.job_id,
        )
        o.id = self.recorder.begin(start)

    def stage(self, name: str, fn: Stage, *, announce: bool = True) -> None:
        """Run one stage unless an earlier one stopped the drill; record its checks. A stage
        that will do no work (a replay switched off) is not announced as if it did."""
        if self.dist is not None:
            self.dist.reached(name)
        failpoint(name)
        if self.stopped is not None:
            return
        self.outcome.phase = name
        self.recorder.phase(name)
        if announce:
            self.progress.phase(name)
        results = fn(self)
        self.results.update({r.name: r for r in results})
        if results:
            self.recorder.checks(results)

    def stop(self, why: str) -> None:
        self.stopped = why

    @contextmanager
    def guarded(self) -> Iterator[None]:
        """Interrupts, the deadline and drill's own failures end the drill; they never escape it."""
        self.guard.timeout = self.request.timeout
        with self.guard:
            try:
                yield
            except (Interrupted, KeyboardInterrupt):
                self.guard.signum = self.guard.signum or 2
            except (SystemExit, GeneratorExit):
                raise
            except BaseException:  # noqa: BLE001 - drill's own failure (DCP's CheckpointException is a BaseException)
                if self.guard.timed_out:
                    self.drill_error = (
                        f"the drill ran past its {self.request.timeout:g} s timeout during {self.outcome.phase}"
                    )
                    self.outcome.error = self.drill_error
                elif self.guard.signum is None:  # an interrupt wrapped by a library is still one
                    text = traceback.format_exc()
                    err = sys.exc_info()[1]
                    self.drill_error = err.message if isinstance(err, DrillError) else text.strip().splitlines()[-1]
                    self.outcome.error = text
            finally:
                self.guard.quiet()
                if self.scratch_copy is not None:
                    shutil.rmtree(self.scratch_copy, ignore_errors=True)

    def _signal_explained(self) -> None:
        """A launcher's SIGTERM is how a job ends when one of its ranks dies: torchrun's agent, and
        srun, stop the survivors first. When a peer died or failed, that is the drill's end — an
        ``error`` naming it — not the signal that followed."""
        if self.guard.signum is None or self.dist is None or not self.dist.is_root:
            return  # the other ranks ask only whether rank 0 lives (see ranks.settle)
        dead = self.dist.casualties()
        if dead:
            shown = "; ".join(why for _, why in dead[:20]) + (
                f"; and {len(dead) - 20} more ranks" if len(dead) > 20 else ""
            )
            name = signal.Signals(self.guard.signum).name
            self.drill_error = f"{shown}; its launcher then stopped this rank ({name})"
            self.guard.signum = None

    def finish(self) -> DrillOutcome:
        """The verdict, from the checks and what happened to drill itself; recorded once."""
        o = self.outcome
        why = self.stopped or (
            f"the drill ended during {o.phase}" if self.guard.signum or self.drill_error else "not reached"
        )
        o.checks = [self.results.get(name) or not_run(name, why) for name in ORDER]
        if "integrity" in self.results:
            o.evidence_level = evidence_of(self.results["integrity"])
        self._signal_explained()
        if self.request.slo is not None and not self.guard.signum:
            o.slo_breaches = self.request.slo.breaches(o.timings.restore, o.timings.ttfs)
        verdict = decide(
            o.checks,
            drill_error=self.drill_error,
            replay_error=self.replay_error,
            slo_breaches=o.slo_breaches,
            interrupted_by=self.guard.signum,
        )
        o.status, o.exit_code, o.message = verdict.status, verdict.exit_code, verdict.message
        if self.guard.signum is not None:
            o.message = f"{verdict.message} during {o.phase}"
        o.finished_at = datetime.now(timezone.utc)
        self.recorder.finish(o)
        return o


# -- the stages -----------------------------------------------------------------------------
def preflight(d: Drill) -> None:
    """List the run and choose the checkpoint before a record is opened: what a typo gets
    wrong never becomes an audit record. Raises :class:`~drill.errors.NothingToDrill` (the run
    root is not there, it retains no checkpoint, the selector names none: exit 3),
    :class:`~drill.errors.StorageProblem` (the storage refuses or fails: exit 5) or
    :class:`~drill.errors.UsageError` (a replay entrypoint named by hand that does not exist).
    A run holding only incomplete saves is a verdict on the run: recorded, as failed."""
    from drill.errors import storage_unavailable
    from drill.interrupts import deadline

    root, inputs = d.request.root, d.inputs
    assert root is not None
    d.progress.phase("discover")
    try:
        with deadline(d.request.timeout, f"listing {root}"):
            inputs.discovery = discover(d.storage, root)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NothingToDrill(
            f"run root {root} does not exist or is not a directory ({exc.strerror})",
            hint="check the path; is the checkpoint filesystem mounted on this host? (nothing was recorded)",
        ) from None
    except OSError as exc:
        raise storage_unavailable(root, exc) from None
    try:
        choice = _choose(d)
    except NothingToDrill as exc:
        if inputs.discovery.incomplete and not inputs.discovery.checkpoints:
            inputs.nothing_to_drill = exc  # the run's saves are all unfinished: that is the finding
            return
        raise
    inputs.ref, inputs.selection = choice.ref, choice.reason
    d.outcome.selection = choice.reason
    d.outcome.checkpoint = CheckpointInfo(
        uri=choice.ref.uri, name=choice.ref.name, step=choice.ref.step, format=choice.ref.format
    )
    _entrypoint_exists(d)


def _entrypoint_exists(d: Drill) -> None:
    spec = d.request.replay
    if spec.enabled and spec.python:  # a usage error before anything is recorded
        from drill.replay.candidate import environment

        d.candidate = environment(spec.python)
        return  # the entrypoint is looked for on the candidate's import path, by the replay
    if not (spec.enabled and spec.entrypoint):
        return
    if not entrypoint_findable(spec.entrypoint, replay_dir(d)):
        where = spec.entrypoint.split(":", 1)[0]
        raise UsageError(
            f"--replay {spec.entrypoint}: no module {where.split('.', 1)[0]!r} on the replay's import path (installed packages, and the run directory)",
            hint="install the trainer's package where drill runs, or put the module in the run directory (nothing was recorded)",
        )


def replay_dir(d: Drill) -> str:
    """The run directory the replay runs in (a single-file checkpoint's own directory)."""
    ref, root = d.inputs.ref, d.inputs.root
    return root if ref is None or ref.uri != root else root.rstrip("/").rsplit("/", 1)[0]


def discover_stage(d: Drill) -> list[CheckResult]:
    """What :func:`preflight` found, as the ``discover`` and ``resume`` checks."""
    if d.dist is not None and not d.dist.is_root:
        return ranks.follow_discovery(d)
    if d.inputs.nothing_to_drill is not None:
        d.stop(f"nothing to drill: {d.inputs.nothing_to_drill.message}")
    d.timings.discover = time.perf_counter() - d.started
    if d.dist is not None:
        ranks.lead_discovery(d)
    return run_checks(("discover", "resume"), d.inputs)


def _choose(d: Drill):  # type: ignore[no-untyped-def]
    found, request = d.inputs.discovery, d.request
    assert found is not None
    if request.selection is not None:
        return choose(
            found,
            request.selection,
            now=time.time(),
            keep_last=request.keep_last,
            last_drilled=d.recorder.last_drilled(found.root),
        )
    return select(found, request.selector)  # type: ignore[arg-type]


def plan_stage(d: Drill) -> list[CheckResult]:
    """List the checkpoint and read its manifests: what to hash. A path out of the
    checkpoint stops the drill here, with nothing opened."""
    if d.dist is not None and not d.dist.is_root:
        return ranks.follow_plan(d)
    started = time.perf_counter()
    ref, request = d.inputs.ref, d.request
    assert ref is not None
    ledger = d.recorder.last_verified(ref.uri) if request.sample.kind == "auto" else {}  # type: ignore[union-attr]
    drilled = ref  # what the record names: the checkpoint itself, never a scratch copy of it
    if request.scratch is not None and scheme_of(ref.uri) != "file":
        ref = _to_scratch(d, ref)
    plan = plan_integrity(d.storage, ref.uri, request.sample, ledger, key=d.key)  # type: ignore[arg-type]
    d.inputs.plan = plan
    o = d.outcome
    o.evidence_level = "sealed" if plan.manifest is not None else None  # until the integrity check says what it proved
    o.checkpoint = CheckpointInfo(
        uri=drilled.uri,
        name=drilled.name,
        step=drilled.step,
        format=drilled.format,
        bytes=sum(plan.on_storage.values()) or None,
        files=len(plan.on_storage) or None,
    )
    d.recorder.selected(o.checkpoint, selection=o.selection or "", evidence_level=o.evidence_level, sample=o.sample)
    d.timings.plan = time.perf_counter() - started
    if plan.refuse:
        d.stop("a path leads out of the checkpoint: nothing was opened")
    if d.dist is not None:
        ranks.share_plan(d)
    return run_checks(("integrity",), d.inputs) if plan.refuse else []


def _to_scratch(d: Drill, ref: CheckpointRef) -> CheckpointRef:
    """Copy a remote checkpoint to the scratch directory; from here on the drill reads the copy."""
    assert d.request.scratch is not None
    clear_stale_scratch(d.request.scratch)
    local = os.path.join(d.request.scratch, f"drill-{socket.gethostname()}-{os.getpid()}-{ref.name}")
    d.scratch_copy = local
    listing = list_files(d.storage, ref.uri)
    for rel in sorted(listing.files):
        target = os.path.join(local, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with d.storage.open(d.storage.child(ref.uri, rel)) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    manifest = d.storage.child(ref.uri, MANIFEST_NAME)
    try:
        with d.storage.open(manifest) as src, open(os.path.join(local, MANIFEST_NAME), "wb") as dst:
            shutil.copyfileobj(src, dst)
    except FileNotFoundError:
        pass
    d.storage = d.inputs.storage = LocalStorage()
    copied = replace(ref, uri=local)
    d.inputs.ref = copied
    discover = d.results.get("discover")
    if discover is not None:
        discover.summary += f"; read from a scratch copy in {local} (removed afterwards)"
        discover.evidence["scratch_copy"] = local
    return copied


def clear_stale_scratch(scratch: str) -> list[str]:
    """Remove the copies this host's drills left when they were killed (SIGKILL, OOM): their
    process is gone, so nothing else would. Copies of live drills, and other hosts', stay."""
    try:
        names = os.listdir(scratch)
    except OSError:
        return []
    prefix = f"drill-{socket.gethostname()}-"
    removed = []
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0] if name.startswith(prefix) else ""
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restore_stage(d: Drill) -> list[CheckResult]:
    """Read every file once — hashing the bytes it then deserializes — and load every tensor
    onto the device, as a resume would."""
    ref, plan = d.inputs.ref, d.inputs.plan
    assert ref is not None
    adapter = formats.get(resolve_format(d.request.format, ref.format))  # imported off the clock
    if d.request.allow_classes:
        from drill.formats.safeload import resolve_globals

        resolve_globals(d.request.allow_classes)  # so are the allow-listed classes' modules
    ctx = RestoreContext(
        device=d.device,  # type: ignore[arg-type]
        progress=d.progress,
        hash_plan=plan.hash_plan if plan is not None else d.hash_plan,
        allow_classes=d.request.allow_classes,
        memory_budget=d.request.memory_budget
        if isinstance(d.request.memory_budget, int)
        else None,  # parsed by the request
    )
    d.outcome.page_cache = _page_cache(d, ref)  # off the clock: dropping pages is not the restore
    started = time.perf_counter()
    result = adapter.restore(d.storage, ref, ctx) if d.dist is None else ranks.restore_across_ranks(d, adapter, ctx)
    if result is None:  # a rank other than 0: its share is done
        return []
    t = d.timings
    t.read, t.load = result.read_seconds, result.load_seconds
    t.restore = (t.discover or 0.0) + (t.plan or 0.0) + (time.perf_counter() - started)
    d.inputs.restore = result
    d.outcome.bytes_read = result.bytes_read
    d.restored_step = _restored_step(result.state, ref.step)
    refused = [f for f in result.files if f.error_kind in INFRASTRUCTURE]
    if refused:
        # The storage refused drill or kept failing: nothing the checks would say about the
        # state could be told apart from that. The files check names what could not be read;
        # the drill is an error (the infrastructure's), never a verdict on the checkpoint.
        d.drill_error = f"the storage would not serve {refused[0].relative_path} ({refused[0].error}): the checkpoint could not be judged"
        d.stop(d.drill_error)
        return run_checks(("files",), d.inputs)
    return []


def check_stage(d: Drill) -> list[CheckResult]:
    """The state checks over what was restored; the coverage ledger learns what was proven."""
    started = time.perf_counter()
    checkpoint, days = d.outcome.checkpoint, d.request.coverage_days
    if checkpoint is not None:
        d.inputs.ledger = lambda update: d.recorder.verified(checkpoint, update, days)
    d.inputs.coverage_days = days
    results = run_checks(STATE_CHECKS, d.inputs)
    d.timings.checks = time.perf_counter() - started
    restore = d.inputs.restore
    if restore is not None:
        restore.state.clear()  # free the restored tensors (and device memory) before the replay
        if getattr(d.device, "type", "cpu") == "cuda":
            import torch

            torch.cuda.empty_cache()
    return results


def replay_stage(d: Drill) -> list[CheckResult]:
    """K training steps from the checkpoint in the real training objects, compared with
    what the original run did."""
    started = time.perf_counter()
    outcome = _replay(d)
    d.timings.replay = time.perf_counter() - started
    if outcome.first_step_at is not None:
        d.timings.ttfs = outcome.first_step_at - d.started
    if outcome.verdict == ERROR:
        d.replay_error = outcome.reason
        d.outcome.error = outcome.traceback or outcome.reason
    d.inputs.replay = outcome
    d.outcome.replay = ReplaySummary(verdict=outcome.verdict, reason=outcome.reason, steps=replay_rows(outcome))
    return run_checks(("replay",), d.inputs)


def _replay(d: Drill) -> ReplayOutcome:
    request, ref, restore = d.request, d.inputs.ref, d.inputs.restore
    assert ref is not None and restore is not None
    if not request.replay.enabled:
        why = f"disabled by policy {request.policy} (replay.enabled: false)" if request.policy else "--no-replay"
        return ReplayOutcome(verdict=NOT_RUN, reason=f"replay not run ({why}): the drill proves the restore only")
    if d.dist is not None:
        d.peers = ranks.DrillPeers(d.dist)
    broken = [d.results[n] for n in LOADING_CHECKS if n in d.results and d.results[n].status is CheckStatus.FAILED]
    if broken:
        return ReplayOutcome(verdict=NOT_REPLAYABLE, reason=f"{broken[0].name} failed: {broken[0].summary}")
    saved = restore.layout.saved_ranks if restore.layout is not None else []
    if not formats.get(ref.format).replays_through_dcp and request.replay.entrypoint is None:
        return ReplayOutcome(
            verdict=NOT_REPLAYABLE,
            reason=f"no replay entrypoint for this {formats.get(ref.format).label} checkpoint: pass --replay module:function",
        )
    return run_replay(
        spec=request.replay,
        run_dir=replay_dir(d),
        checkpoint=ref.uri,
        step=d.restored_step,
        device=str(d.device),
        storage_options=request.storage_options,
        saved_ranks=max(1, len(saved)),
        candidate=d.candidate,
        peers=d.peers,
    )


def _page_cache(d: Drill, ref: CheckpointRef) -> dict[str, Any]:
    """Cold: drop the checkpoint's pages from this host's cache first; warm: say how much of it
    is cached. Either way the record says where the restore read from; a host that cannot say
    (a file that vanished; a kernel without cachestat records the count as unknown) records why, and the drill goes on."""
    try:
        plan = d.inputs.plan
        sizes = plan.on_storage if plan is not None else list_files(d.storage, ref.uri).files
        files = {d.storage.child(ref.uri, rel): size for rel, size in sorted(sizes.items())}
        state = d.storage.evict(files) if d.request.cold else d.storage.cached(files)
        return {"cold": d.request.cold, **state.to_dict()}
    except (OSError, ValueError) as exc:
        return {"cold": d.request.cold, "error": one_line(exc)}


def _restored_step(state: dict, fallback: int | None) -> int | None:
    step: Any = state.get("train_state.step")
    if step is not None and hasattr(step, "item"):
        step = step.item()
    whole = isinstance(step, int) or (isinstance(step, float) and math.isfinite(step) and step.is_integer())
    return int(step) if whole and not isinstance(step, bool) else fallback


def job_id_from_env() -> str | None:
    """The batch job this drill runs in: ``$DRILL_JOB_ID``, else Slurm's job id, else torchrun's
    run id (each attempt of a restarted job runs under the same one: their records are linked)."""
    env = os.environ
    if env.get("DRILL_JOB_ID"):
        return env["DRILL_JOB_ID"][:128]
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}"
    return f"torchrun:{env['TORCHELASTIC_RUN_ID']}"[:128] if env.get("TORCHELASTIC_RUN_ID") else None
