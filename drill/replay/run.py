"""Running a replay in a child process under a wall-clock timeout, and judging it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
from typing import Any

from drill import safe_json
from drill.proc import trusted_path
from drill.replay.compare import CROSS_DEVICE, SAME_DEVICE, Divergence, Tolerance, compare_steps
from drill.replay.outcome import DIVERGED, ERROR, NOT_REPLAYABLE, NOT_RUN, PASSED, REFUSED, ReplayOutcome
from drill.replay.processes import Peers, Placement, merge_parts, part_of, run_children
from drill.replay.reference import Reference, load_reference
from drill.replay.spec import ENTRYPOINT, ReplaySpec, anchored, entrypoint_file
from drill.runlog.steplog import STEP_LOG, StepRecord
from drill.storage import Storage, storage_for

FRAMEWORK_LOG = Tolerance(rtol=1e-3, atol=1e-4)
"""Frameworks round what they log (HF: 4 decimals): compare to that precision."""
RESHARDED = Tolerance(rtol=1e-5, atol=1e-6)
"""Another number of ranks sums the same numbers in another order (the loss's all-reduce, the
grad norm's shards): a replay resharded from N to M ranks that is right agrees to ~1e-6."""

__all__ = [
    "DIVERGED", "ERROR", "NOT_REPLAYABLE", "NOT_RUN", "PASSED", "REFUSED", "ReplayOutcome",
    "entrypoint_findable", "entrypoint_for", "run_replay", "tolerance_for",
]  # fmt: skip


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


def tolerance_for(reference: Reference, device: str, spec: ReplaySpec, *, resharded: bool = False) -> Tolerance:
    if spec.tolerance is not None:
        return spec.tolerance
    if reference.source != STEP_LOG:
        return FRAMEWORK_LOG
    if resharded:
        return RESHARDED
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
    saved_ranks: int = 1,
    candidate: dict[str, Any] | None = None,
    peers: Peers | None = None,
) -> ReplayOutcome:
    """Replay K steps after ``checkpoint`` (at ``step``, saved by ``saved_ranks``) by as many
    ranks — or by ``spec.ranks``: resharded — and compare with the original run; the outcome
    names the entrypoint that ran and who named it. ``candidate``: the environment of
    ``spec.python`` as probed before the drill began (:mod:`drill.replay.candidate`).
    ``peers``: the other ranks of a distributed drill — a replay of as many ranks as the drill
    has runs one rank on each (always told whether a replay runs)."""
    from drill.replay.candidate import changes, environment

    storage = storage_for(run_dir, storage_options)
    entrypoint, explicit = entrypoint_for(run_dir, spec, storage)
    world = (spec.ranks or saved_ranks, saved_ranks)
    try:
        outcome = _replay(
            spec, run_dir, checkpoint, step, device, storage, storage_options, entrypoint, explicit, world, peers
        )
    finally:
        if peers is not None:
            peers.start(None)  # no replay after all: the others stop waiting for one
    outcome.ranks, outcome.saved_ranks = world
    current = environment()
    outcome.environment = {"current": current}
    if candidate is not None:
        outcome.environment.update(candidate=candidate, changed=changes(current, candidate))
    if entrypoint is not None:
        outcome.entrypoint, outcome.entrypoint_source = entrypoint, "--replay" if explicit else "run.json"
    return outcome


def _replay(
    spec: ReplaySpec, run_dir: str, checkpoint: str, step: int | None, device: str, storage: Storage,
    storage_options: dict[str, Any] | None, entrypoint: str | None, explicit: bool, world: tuple[int, int],
    peers: Peers | None,
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
            hint="drill an older checkpoint: the replay compares with the steps the run logged after it",
        )
    k = max(wanted) - step
    ranks, saved = world
    tol = tolerance_for(reference, device, spec, resharded=ranks != saved)
    trust = "explicit" if explicit else "implicit"
    args = [entrypoint, trust, run_dir, checkpoint, device, str(k), json.dumps(storage_options or {})]
    outcome = _run(args, spec, world, (run_dir, checkpoint), started, peers)
    outcome.tolerance, outcome.reference_source, outcome.saved_ranks = tol, reference.source, saved
    if outcome.verdict in (ERROR, REFUSED):
        outcome.steps = [(reference.steps.get(got.step), got) for _, got in outcome.steps]
        moved = _moved(outcome, entrypoint) if spec.python is not None else None
        return _classes_diverged(outcome, step, moved) if moved else outcome
    outcome.keys_untaken = [k for k in outcome.keys_untaken if not _another_ranks(k, ranks)]
    if outcome.keys_missing or outcome.keys_untaken:
        return _keys_diverged(outcome, step)
    streams = _streams(outcome, reference)
    if not streams:
        return _nothing_to_compare(outcome)
    return _judge(outcome, reference, streams, step, wanted, tol, spec)


def _run(
    args: list[str], spec: ReplaySpec, world: tuple[int, int], untrusted: tuple[str, str], started: float,
    peers: Peers | None,
) -> ReplayOutcome:  # fmt: skip
    """The replay's processes: one rank on each rank of a distributed drill of as many (every
    rank's part merged here, on rank 0), else all of them on this host."""
    ranks, saved = world
    if peers is None or peers.size != ranks:
        return run_children(
            args, placement=Placement(ranks, ranks > 1 or saved > 1), timeout=spec.timeout, started=started,
            untrusted=untrusted, python=spec.python,
        )  # fmt: skip
    peers.start({"args": args, "ranks": ranks, "timeout": spec.timeout, "python": spec.python, "untrusted": untrusted})
    outcome = run_children(
        args, placement=Placement(ranks, True, 0, peers.store, peers.prefix), timeout=spec.timeout, started=started,
        untrusted=untrusted, python=spec.python, stop=peers.failed,
    )  # fmt: skip
    if outcome.verdict != PASSED and not outcome.interrupted:
        peers.fail(f"rank 0: {outcome.reason}")
    merge_parts(outcome, peers.collect(part_of(outcome, secondary=outcome.interrupted)))
    return outcome


_RANK_KEY = re.compile(r"(?:^|\.)rank_(\d+)(?:\.|$)")


def _another_ranks(key: str, ranks: int) -> bool:
    """A key of per-rank state (``….rank_<r>.…``) of a rank a resharded replay does not have."""
    found = _RANK_KEY.search(key)
    return found is not None and int(found.group(1)) >= ranks


def _keys_diverged(outcome: ReplayOutcome, step: int) -> ReplayOutcome:
    """The replay's objects do not take the checkpoint as it was saved: the keys, by name."""
    missing, untaken = outcome.keys_missing, outcome.keys_untaken
    outcome.verdict = DIVERGED
    outcome.divergence = Divergence(step, "keys", untaken, missing)
    parts = []
    if missing:
        parts.append(f"they ask for {len(missing)} key(s) it does not hold ({_some(missing)})")
    if untaken:
        parts.append(f"it holds {len(untaken)} key(s) they do not take ({_some(untaken)})")
    ending = "the resume fails" if missing else "a resume would silently drop that state"
    outcome.reason = f"the replay's training objects do not take the checkpoint as saved: {'; '.join(parts)}: {ending}"
    outcome.hint = (
        "a renamed or removed parameter or state entry: map the old keys on load (a state-dict hook), or keep the names"
    )
    return outcome


_MOVED = (
    re.compile(r"No module named '(?P<module>[\w.]+)'"),
    re.compile(r"Can't get attribute '(?P<name>\w+)' on <module '(?P<module>[\w.]+)'"),
    re.compile(r"module '(?P<module>[\w.]+)' has no attribute '(?P<name>\w+)'"),
    re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>[\w.]+)'"),
)


def _moved(outcome: ReplayOutcome, entrypoint: str) -> str | None:
    """The class or module a replay under a candidate environment could not find while it
    restored — one the checkpoint (or the code that reads it) names and the candidate no longer
    has; None for anything else, and for the entrypoint's own module (the candidate lacks the
    trainer: its installation, not the checkpoint)."""
    if "while starting" not in outcome.reason:
        return None
    for pattern in _MOVED:
        found = pattern.search(outcome.reason)
        if found:
            module, name = found.group("module"), found.groupdict().get("name")
            if module.split(".")[0] == entrypoint.rpartition(":")[0].split(".")[0] and name is None:
                return None
            return f"{module}.{name}" if name else module
    return None


def _classes_diverged(outcome: ReplayOutcome, step: int, moved: str) -> ReplayOutcome:
    cause = outcome.reason.rpartition(": ")[2]
    outcome.verdict = DIVERGED
    outcome.divergence = Divergence(step, "classes", moved, None)
    outcome.reason = (
        f"under the candidate environment the checkpoint does not restore: it needs {moved}, which the "
        f"candidate's code no longer has where it was ({cause}): the resume fails"
    )
    outcome.hint = "a class or module that moved or was renamed in the new version: keep an alias at the old path, or convert the checkpoint"
    return outcome


def _some(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (f", … {len(keys) - 5} more" if len(keys) > 5 else "")


def _streams(
    outcome: ReplayOutcome, reference: Reference
) -> list[tuple[int | None, dict[int, StepRecord], list[StepRecord]]]:
    """What is compared with what: the run's view (its global loss) with the run's log, and —
    by as many ranks as saved it — each rank's own with that rank's log. ``outcome.steps``
    becomes the steps shown: the run's view, else rank 0's."""
    run = [got for _, got in outcome.steps]
    streams: list[tuple[int | None, dict[int, StepRecord], list[StepRecord]]] = (
        [(None, reference.steps, run)] if run else []
    )
    if not outcome.resharded:
        mine = sorted((r, got) for r, got in outcome.rank_steps.items() if r in reference.ranks)
        streams += [(r, reference.ranks[r], got) for r, got in mine]
    shown, against = (run, reference.steps) if run else (outcome.rank_steps.get(0, []), reference.ranks.get(0, {}))
    outcome.steps = [(against.get(got.step), got) for got in shown]
    return streams


def _nothing_to_compare(outcome: ReplayOutcome) -> ReplayOutcome:
    outcome.verdict = NOT_REPLAYABLE
    if outcome.resharded:
        outcome.reason = (
            f"resharded from {outcome.saved_ranks} to {outcome.ranks} ranks, the replay compares the run's global "
            "view, which the replay target's step() did not give"
        )
        outcome.hint = "return (this rank's record, the run's record) from step(): the run's as rank 0 logged it"
    else:
        outcome.reason = f"replayed by {outcome.ranks} ranks, but no rank logged its own steps and the target gave no run view to compare"
        outcome.hint = (
            "log each rank's steps (StepLog(run_dir, rank=r)) or return (rank record, run record) from step()"
        )
    return outcome


def _judge(
    outcome: ReplayOutcome, reference: Reference, streams: list[tuple[int | None, dict[int, StepRecord], list[StepRecord]]],
    step: int, wanted: list[int], tol: Tolerance, spec: ReplaySpec,
) -> ReplayOutcome:  # fmt: skip
    """The verdict on replayed steps: they resumed where the checkpoint is, match the original run
    step by step (each rank its own log), and the checkpoint's own history kept the run's data
    order across resumes."""
    replayed = streams[0][2]
    if replayed and replayed[0].step != step + 1:
        outcome.verdict = DIVERGED
        outcome.divergence = Divergence(replayed[0].step, "step", step + 1, replayed[0].step)
        outcome.reason = f"the restored objects resumed at step {replayed[0].step}, not {step + 1}"
        return outcome
    outcome.divergence = first_divergence(streams, tol)
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
        if outcome.resharded:
            outcome.reason += (
                f" (resharded from {outcome.saved_ranks} to {outcome.ranks} ranks, compared within rtol={tol.rtol:g}: "
                "randomness each rank draws for itself — dropout streams — cannot survive a reshard)"
            )
    else:
        outcome.verdict = PASSED
        outcome.reason = _passed(outcome, reference, streams, step, tol)
        if len(wanted) < spec.steps:
            outcome.reason += f" ({len(wanted)} of the {spec.steps} steps asked for: the original run's record ({reference.source}) has no more after step {step})"
    return outcome


def first_divergence(
    streams: list[tuple[int | None, dict[int, StepRecord], list[StepRecord]]], tol: Tolerance
) -> Divergence | None:
    """The earliest step where any stream left the original run. At one step, what a rank
    computes alone (its batch, its loss) before what the ranks share (the grad norm, reduced
    over all of them: it moves everywhere at once), and a rank's own log before the run's —
    the divergence named is the one that says which rank left the run."""
    found = [
        dataclasses.replace(d, rank=rank)
        for rank, ref, got in streams
        if (d := compare_steps(ref, got, tol)) is not None
    ]
    return min(found, key=lambda d: (d.step, _LOCAL_FIRST.get(d.what, 3), d.rank is None, d.rank or 0), default=None)


_LOCAL_FIRST = {"data": 0, "loss": 1, "grad_norm": 2}


def _passed(
    outcome: ReplayOutcome, reference: Reference, streams: list[tuple[int | None, dict[int, StepRecord], list[StepRecord]]],
    step: int, tol: Tolerance,
) -> str:  # fmt: skip
    exact = tol.rtol == 0 and tol.atol == 0
    has_data = any(r.batch for _, ref, _ in streams for r in ref.values())
    compared = (
        "data order, loss and grad norm"
        if has_data
        else "loss and grad norm (the record has no batch fingerprints: data order not compared)"
    )
    by = ""
    if outcome.resharded:
        by = f" (resharded: saved by {outcome.saved_ranks} ranks, replayed by {outcome.ranks}; the run's global view)"
    elif outcome.ranks > 1:
        own = sum(1 for rank, _, _ in streams if rank is not None)
        by = f" (by {outcome.ranks} ranks; {own} of them compared with their own logs)"
    return (
        f"{len(streams[0][2])} steps after step {step} match the original run "
        f"{'bit for bit' if exact else f'within rtol={tol.rtol:g}, atol={tol.atol:g}'}: {compared}{by}"
    )
