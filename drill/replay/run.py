"""Running a replay in a child process under a wall-clock timeout, and judging it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from drill import safe_json
from drill.proc import child_preexec, message_by, python_command, trusted_path
from drill.replay.compare import CROSS_DEVICE, SAME_DEVICE, Divergence, Tolerance, compare_steps
from drill.replay.reference import Reference, load_reference
from drill.replay.spec import ENTRYPOINT, ReplaySpec, anchored, entrypoint_file
from drill.replay.zygote import take as take_zygote
from drill.runlog.steplog import STEP_LOG, StepRecord
from drill.storage import Storage, storage_for

FRAMEWORK_LOG = Tolerance(rtol=1e-3, atol=1e-4)
"""Frameworks round what they log (HF: 4 decimals): compare to that precision."""

PASSED, DIVERGED, NOT_REPLAYABLE, ERROR, REFUSED = "passed", "diverged", "not replayable", "error", "refused"
NOT_RUN = "not run"
"""The replay was switched off (``--no-replay``, a policy's ``replay.enabled: false``): a gap the drill chose."""


@dataclass(slots=True, kw_only=True)
class ReplayOutcome:
    verdict: str
    reason: str
    steps: list[tuple[StepRecord | None, StepRecord]] = field(default_factory=list)
    """(reference, replayed) per replayed step."""
    divergence: Divergence | None = None
    tolerance: Tolerance | None = None
    reference_source: str | None = None
    first_step_at: float | None = None
    """perf_counter when the first replayed step finished (for time-to-first-step)."""
    restore_seconds: float | None = None
    seconds: float = 0.0
    traceback: str | None = None
    entrypoint: str | None = None
    """The ``module:function`` that built the training objects (None: none was found)."""
    entrypoint_source: str | None = None
    """Who named it: ``--replay`` (or a policy's ``replay.entrypoint``), or the run's ``run.json``."""
    hint: str | None = None
    """What would make it replayable, when something would."""


def entrypoint_for(run_dir: str, spec: ReplaySpec, storage: Storage | None = None) -> tuple[str | None, bool]:
    """(entrypoint, explicit): ``--replay`` or the policy's (explicit), else the one the run
    names in its ``run.json`` (the demo does), which is only trusted outside the run."""
    if spec.entrypoint:
        return spec.entrypoint, True
    storage = storage or storage_for(run_dir)
    try:
        with storage.open(storage.child(run_dir, "run.json")) as f:
            doc = safe_json.loads(f.read(1 << 20))
        named = doc.get("replay") if isinstance(doc, dict) else None
    except (ValueError, OSError, RecursionError):
        return None, False
    # a file the run names is read against the run directory (and so refused when it lies there)
    return (anchored(named, run_dir), False) if isinstance(named, str) and ENTRYPOINT.match(named) else (None, False)


def entrypoint_findable(entrypoint: str, run_dir: str) -> bool:
    """Whether the replay child would find ``entrypoint``'s top-level module — on the path it
    gets (this process's, minus the run, plus the run directory for a module named by hand) —
    found without importing anything."""
    import importlib.machinery

    file = entrypoint_file(entrypoint)
    if file is not None:
        return os.path.isfile(file)
    top = entrypoint.split(":", 1)[0].split(".", 1)[0]
    if top in sys.builtin_module_names:
        return True
    return importlib.machinery.PathFinder.find_spec(top, [*trusted_path((run_dir,)), run_dir]) is not None


def tolerance_for(reference: Reference, device: str, spec: ReplaySpec) -> Tolerance:
    if spec.tolerance is not None:
        return spec.tolerance
    if reference.source != STEP_LOG:
        return FRAMEWORK_LOG
    same = reference.device is None or reference.device.split(":")[0] == device.split(":")[0]
    return SAME_DEVICE if same else CROSS_DEVICE


def run_replay(
    *,
    spec: ReplaySpec,
    run_dir: str,
    checkpoint: str,
    step: int | None,
    device: str,
    storage_options: dict[str, Any] | None = None,
) -> ReplayOutcome:
    """Replay K steps after ``checkpoint`` (at ``step``) and compare with the original run; the
    outcome names the entrypoint that ran and who named it."""
    storage = storage_for(run_dir, storage_options)
    entrypoint, explicit = entrypoint_for(run_dir, spec, storage)
    outcome = _replay(spec, run_dir, checkpoint, step, device, storage, storage_options, entrypoint, explicit)
    if entrypoint is not None:
        outcome.entrypoint, outcome.entrypoint_source = entrypoint, "--replay" if explicit else "run.json"
    return outcome


def _replay(
    spec: ReplaySpec, run_dir: str, checkpoint: str, step: int | None, device: str, storage: Storage,
    storage_options: dict[str, Any] | None, entrypoint: str | None, explicit: bool,
) -> ReplayOutcome:  # fmt: skip
    started = time.perf_counter()
    if entrypoint is None:
        return ReplayOutcome(
            verdict=NOT_REPLAYABLE,
            reason="no replay entrypoint: pass --replay module:function (or name one in the run's run.json)",
        )
    reference = load_reference(run_dir, storage)
    if reference is None:
        return ReplayOutcome(
            verdict=NOT_REPLAYABLE,
            reason=f"no record of the original run under {run_dir} ({STEP_LOG}, trainer_state.json, metrics.csv or TensorBoard events)",
        )
    if step is None:
        return ReplayOutcome(
            verdict=NOT_REPLAYABLE,
            reason="the checkpoint's step is unknown, so its place in the original run's record is too",
        )
    wanted = [s for s in reference.steps if step < s <= step + spec.steps]  # never a range of --replay-steps
    if not wanted:
        last = max(reference.steps)
        return ReplayOutcome(
            verdict=NOT_REPLAYABLE,
            reason=f"the original run's record ({reference.source}) ends at step {last}: nothing after step {step} to compare",
            reference_source=reference.source,
        )
    k = max(wanted) - step
    tol = tolerance_for(reference, device, spec)
    outcome = _run_child(
        entrypoint, explicit, run_dir, checkpoint, device, k, spec.timeout, started, storage_options or {}
    )
    outcome.tolerance = tol
    outcome.reference_source = reference.source
    replayed = [got for _, got in outcome.steps]
    outcome.steps = [(reference.steps.get(got.step), got) for got in replayed]
    if outcome.verdict in (ERROR, REFUSED):
        return outcome
    return _judge(outcome, reference, replayed, step, wanted, tol, spec)


def _judge(
    outcome: ReplayOutcome, reference: Reference, replayed: list[StepRecord], step: int, wanted: list[int],
    tol: Tolerance, spec: ReplaySpec,
) -> ReplayOutcome:  # fmt: skip
    """The verdict on replayed steps: they resumed where the checkpoint is, match the original run
    step by step, and the checkpoint's own history kept the run's data order across resumes."""
    if replayed and replayed[0].step != step + 1:
        outcome.verdict = DIVERGED
        outcome.divergence = Divergence(replayed[0].step, "step", step + 1, replayed[0].step)
        outcome.reason = f"the restored objects resumed at step {replayed[0].step}, not {step + 1}"
        return outcome
    outcome.divergence = compare_steps(reference.steps, replayed, tol)
    resumed = reference.resumed
    if outcome.divergence is None and resumed is not None and resumed.step <= max(wanted):
        outcome.divergence = resumed  # the checkpoint's own history left the original run's data order
        outcome.verdict = DIVERGED
        outcome.reason = (
            f"data order after a resume diverged at {resumed.where}: batch {resumed.actual}, where the run "
            f"first saw {resumed.expected} (the run was resumed, and its data did not continue where it left off)"
        )
    elif outcome.divergence is not None:
        outcome.verdict, outcome.reason = DIVERGED, outcome.divergence.describe()
    else:
        exact = tol.rtol == 0 and tol.atol == 0
        compared = (
            "data order, loss and grad norm"
            if reference.has_data_order
            else "loss and grad norm (the record has no batch fingerprints: data order not compared)"
        )
        outcome.verdict = PASSED
        outcome.reason = f"{len(replayed)} steps after step {step} match the original run {'bit for bit' if exact else f'within rtol={tol.rtol:g}, atol={tol.atol:g}'}: {compared}"
        if len(wanted) < spec.steps:
            outcome.reason += f" ({len(wanted)} of the {spec.steps} steps asked for: the original run's record ({reference.source}) has no more after step {step})"
    return outcome


def _run_child(
    entrypoint: str,
    explicit: bool,
    run_dir: str,
    checkpoint: str,
    device: str,
    steps: int,
    timeout: float,
    started: float,
    options: dict[str, Any],
) -> ReplayOutcome:
    # Not a fork of this process: one that has used torch's thread pools would deadlock. The
    # child forked before any of that ran (drill.replay.zygote), or else a fresh interpreter.
    # Isolated: nothing in the run directory or the checkpoint is on its import path.
    trust = "explicit" if explicit else "implicit"
    args = [entrypoint, trust, run_dir, checkpoint, device, str(steps), json.dumps(options)]
    proc, read_fd = _start_child(args, untrusted=(run_dir, checkpoint))
    receive = Connection(read_fd, writable=False)
    outcome = ReplayOutcome(verdict=ERROR, reason="")
    try:
        _listen(receive, proc, outcome, steps, started, time.monotonic() + timeout, timeout)
    except BaseException:
        proc.kill()  # interrupted: the child goes at once, not after its grace time
        raise
    finally:
        outcome.seconds = time.perf_counter() - started
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        receive.close()
    return outcome


def _start_child(args: list[str], untrusted: tuple[str, ...]) -> tuple[Any, int]:
    """The replay child and the descriptor its messages arrive on."""
    zygote = take_zygote()
    if zygote is not None:
        return zygote.launch(args, trusted_path(untrusted))
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        python_command("drill.replay.child", str(write_fd), *args, untrusted=untrusted),
        pass_fds=(write_fd,),
        stdin=subprocess.DEVNULL,
        stdout=_stderr_fd(),
        preexec_fn=child_preexec(),
    )
    os.close(write_fd)
    return proc, read_fd


def _listen(
    receive: Connection, proc: Any, outcome: ReplayOutcome, steps: int, started: float, deadline: float, timeout: float
) -> None:
    """Fill ``outcome`` from the child's messages (JSON: the parent never unpickles what a
    child sends) until it is done, fails, dies or runs out of time."""
    phase = "starting"
    while True:
        if not message_by(receive, deadline):
            proc.kill()
            outcome.reason = f"replay timed out after {timeout:g} s ({phase}, {len(outcome.steps)} of {steps} steps done); the child was killed"
            return
        try:
            kind, *rest = safe_json.loads(receive.recv_bytes())
        except EOFError:
            proc.wait(5)
            outcome.reason = f"the replay process died ({_exit(proc.returncode)}) while {phase}"
            return
        if kind == "restored":
            outcome.restore_seconds, phase = time.perf_counter() - started, "replaying"
        elif kind == "step":
            outcome.steps.append((None, StepRecord(**rest[0])))
            outcome.first_step_at = outcome.first_step_at or time.perf_counter()
        elif kind == "refused":
            outcome.verdict, outcome.reason = REFUSED, rest[0]
            return
        elif kind == "error":
            outcome.traceback = rest[0]
            outcome.reason = f"the replay raised while {phase}: {rest[0].strip().splitlines()[-1]}"
            return
        elif kind == "done":
            outcome.verdict = PASSED
            return


def _stderr_fd() -> int:
    """The trainer's prints go to our stderr (stdout carries data), or nowhere if it has no fd."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def _exit(code: int | None) -> str:
    if code is None:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"
