"""One drill, end to end: discover → select → restore → check → record.

:func:`run_drill` is what ``drill run`` calls; everything it does is recorded, from a drill
row committed before the first byte is read to the verdict written after the last check.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field

from drill.checks import Expectations, run_checks
from drill.checks.replay import replay_check, replay_rows
from drill.checks.resume import check_resume
from drill.replay.run import ReplayOutcome, run_replay
from drill.coverage import update_coverage
from drill.discover import CheckpointRef, discover
from drill.errors import DrillError, ExitCode, NothingToDrill, UsageError
from drill.findings import CheckResult, CheckStatus, Finding, Severity
from drill.integrity.sampling import SampleSpec
from drill.policy.model import SLO, Selection
from drill.replay.spec import ReplaySpec
from drill.records.store import Records, Timings
from drill.restore import NullProgress, Progress, RestoreResult
from drill.policy.selection import choose
from drill.select import Selector, select
from drill.integrity.structure import dcp_structure
from drill.integrity.verify import IntegrityPlan, Observed, hash_remaining, integrity_check, plan_integrity
from drill.storage import Storage, StorageError, storage_for


@dataclass(kw_only=True, slots=True)
class DrillRequest:
    selector: Selector
    root: str | None = None
    """The run directory; may be omitted when the selector is a checkpoint path."""
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    trigger: str = "manual"
    expectations: Expectations = field(default_factory=Expectations)
    sample: SampleSpec = field(default_factory=lambda: SampleSpec("all"))
    """Which files to hash; every file unless a sampled drill is asked for."""
    require_sealed: bool = False
    """Fail an unsealed checkpoint instead of accepting a structural proof."""
    coverage_days: float = 7.0
    """Report the share of the checkpoint's bytes verified within this many days."""
    format: str = "auto"
    """Force a format adapter (``dcp``, ``torch-save``, ``lightning``, ``hf-trainer``)."""
    allow_classes: tuple[str, ...] = ()
    """Classes a layout legitimately pickles (e.g. ``transformers.training_args.TrainingArguments``)."""
    replay: ReplaySpec = field(default_factory=ReplaySpec)
    """Replay K steps after the checkpoint and compare with the original run."""
    policy: str | None = None
    """The policy's name, when a policy asked for this drill."""
    policy_selection: Selection | None = None
    """A policy's selection (retention- and settle-aware); overrides ``selector``."""
    keep_last: int | None = None
    slo: SLO | None = None

    def __post_init__(self) -> None:
        if self.root is None:
            if self.selector.kind != "path":
                raise UsageError(f"--root is required with --checkpoint {self.selector}: only a checkpoint path names its run")
            assert self.selector.path is not None
            self.root = os.path.dirname(os.path.abspath(self.selector.path.rstrip("/")))
        if "://" not in self.root:
            # Records key on absolute paths, so `drill history --root` finds a run however it
            # was spelled when drilled.
            self.root = os.path.abspath(self.root)


@dataclass(kw_only=True, slots=True)
class DrillOutcome:
    drill_id: int
    status: str
    """``passed``, ``failed``, ``error`` or ``aborted``: what the record says."""
    exit_code: ExitCode
    checkpoint: CheckpointRef | None
    checks: list[CheckResult]
    timings: Timings
    bytes_read: int | None
    device: str
    message: str | None = None
    """Why the drill did not pass, in one line (for stderr)."""

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks for f in c.findings]


def resolve_device(spec: str):  # type: ignore[no-untyped-def]
    """``auto|cpu|cuda|cuda:N`` → ``torch.device``; raises :class:`UsageError` when unusable."""
    import torch

    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = spec[5:] if spec.startswith("cuda:") else "0"
        if not index.isdigit():
            raise UsageError(f"--device {spec!r}: expected cuda or cuda:N")
        if not torch.cuda.is_available():
            raise UsageError(f"--device {spec}: CUDA is not available on this host (use --device cpu or auto)")
        if int(index) >= torch.cuda.device_count():
            raise UsageError(f"--device {spec}: this host has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device(f"cuda:{index}")
    raise UsageError(f"unknown --device {spec!r}: expected auto, cpu, cuda or cuda:N")


def _nothing_to_drill_check(exc: NothingToDrill, discovery_evidence: dict) -> CheckResult:
    return CheckResult(
        name="discover",
        summary=exc.message,
        findings=[
            Finding(
                check="discover",
                code="no-checkpoint",
                severity=Severity.ERROR,
                subject=discovery_evidence.get("root"),
                message=exc.message,
                hint=exc.hint,
            )
        ],
        evidence=discovery_evidence,
    )


def run_drill(
    request: DrillRequest, records: Records, progress: Progress | None = None, storage: Storage | None = None
) -> DrillOutcome:
    """Run one drill and record it; returns the outcome (never raises for a bad checkpoint).

    Raises :class:`UsageError` for a bad request (before anything is recorded) and
    :class:`DatabaseError` when the record cannot be written; re-raises ``KeyboardInterrupt``
    after recording the drill as ``aborted``.
    """
    import torch

    # Imported before the clock starts: a module import is drill's cost, not the restore's.
    from drill.formats import restore as restore_checkpoint
    from drill.restore import dcp as _dcp  # noqa: F401

    progress = progress or NullProgress()
    device = resolve_device(request.device)
    assert request.root is not None
    root = request.root
    try:
        storage = storage or storage_for(root)
    except StorageError as exc:
        raise UsageError(f"{exc}: this drill reads local and shared filesystems") from None
    started = time.perf_counter()
    timings = Timings()
    # Drills a killed process left `running` on this host are closed as `aborted` first, so the
    # record never shows a drill as in progress that no process is running.
    records.recover_orphans()
    drill_id = records.begin_drill(
        run_root=root,
        selector=str(request.selector),
        trigger=request.trigger,
        device=str(device),
        torch_version=torch.__version__,
    )
    restore: RestoreResult | None = None
    ref: CheckpointRef | None = None
    checks: list[CheckResult] = []

    def finish(status: str, exit_code: ExitCode, message: str | None = None, error: str | None = None) -> DrillOutcome:
        records.finish_drill(
            drill_id, status=status, timings=timings, bytes_read=restore.bytes_read if restore else None, error=error or message
        )
        return DrillOutcome(
            drill_id=drill_id,
            status=status,
            exit_code=exit_code,
            checkpoint=ref,
            checks=checks,
            timings=timings,
            bytes_read=restore.bytes_read if restore else None,
            device=str(device),
            message=message,
        )

    try:
        progress.phase("discover")
        try:
            found = discover(storage, root)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NothingToDrill(
                f"run root {root} does not exist or is not a directory ({exc.strerror})",
                hint="check the path; is the checkpoint filesystem mounted on this host?",
            ) from None
        except PermissionError as exc:
            raise NothingToDrill(f"run root {root} cannot be listed ({exc.strerror})") from None
        finally:
            timings.discover = time.perf_counter() - started
        evidence = {
            "root": root,
            "complete": [c.name for c in found.checkpoints],
            "incomplete": [{"name": s.name, "reason": s.reason} for s in found.incomplete],
        }
        if request.policy_selection is not None:
            choice = choose(
                found,
                request.policy_selection,
                now=time.time(),
                keep_last=request.keep_last,
                last_drilled=records.last_drilled(root),
            )
            ref = choice.ref
            records.set_selection(drill_id, policy=request.policy, selection=choice.reason)
            evidence["selection"] = choice.reason
        else:
            ref = select(found, request.selector)
            if request.policy is not None:
                records.set_selection(drill_id, policy=request.policy, selection=str(request.selector))
        checkpoint_id = records.attach_checkpoint(
            drill_id, run_root=root, uri=ref.uri, step=ref.step, format=ref.format, nbytes=None, file_count=None
        )
        discovered = CheckResult(name="discover", summary=_discovery_summary(found, ref), evidence=evidence)
        resume = check_resume(storage, found)
        ledger = records.last_verified(checkpoint_id) if request.sample.kind == "auto" else {}
        plan = plan_integrity(storage, ref.uri, request.sample, {p: t for p, (t, _) in ledger.items()})
        records.set_evidence_level(drill_id, sample=str(request.sample), evidence_level=plan.evidence_level)
        if plan.refuse:
            checks = [discovered, resume, integrity_check(plan, {})]
            records.add_checks(drill_id, checks)
            return finish("failed", ExitCode.FAILED, message=checks[-1].findings[0].message)

        records.set_phase(drill_id, "restore")
        restore_started = time.perf_counter()
        restore = restore_checkpoint(
            storage, ref, device, progress, plan.hash_plan, allow=request.allow_classes, format=request.format
        )
        timings.read, timings.load = restore.read_seconds, restore.load_seconds
        # Restore latency is what a resume would pay: finding the checkpoint plus getting its
        # state onto the device; drill's own record keeping is left out.
        timings.restore = timings.discover + (time.perf_counter() - restore_started)
        records.attach_checkpoint(
            drill_id,
            run_root=root,
            uri=ref.uri,
            step=ref.step,
            format=ref.format,
            nbytes=sum(plan.on_storage.values()) or None,
            file_count=len(plan.on_storage) or None,
        )
        records.set_phase(drill_id, "checks")
        progress.phase("checks")
        checks_started = time.perf_counter()
        integrity = _integrity(storage, plan, restore, request)
        checks = [discovered, resume, integrity, *run_checks(restore, request.expectations)]
        if plan.manifest is not None:
            update_coverage(records, checkpoint_id, drill_id, plan, integrity, request.coverage_days)
        timings.checks = time.perf_counter() - checks_started
        restored_step = _restored_step(restore, ref)
        restore.state.clear()  # free the restored tensors (and device memory) before the replay
        if device.type == "cuda":
            torch.cuda.empty_cache()
        replay_error = None
        if request.replay.enabled:
            records.set_phase(drill_id, "replay")
            progress.phase("replay")
            replayed = _replay(request, restore, root, ref, restored_step, device, started, timings)
        else:  # still on the record: a drill without a replay has a gap in its evidence
            replayed = ReplayOutcome(verdict="not replayable", reason="replay not run (--no-replay)")
        checks.append(replay_check(replayed))
        records.record_replay(drill_id, verdict=replayed.verdict, ttfs=timings.ttfs, steps=replay_rows(replayed))
        if replayed.verdict == "error":
            replay_error = (replayed.reason, replayed.traceback)
        records.add_checks(drill_id, checks)
        if replay_error is not None:
            return finish("error", ExitCode.ERROR, message=f"replay: {replay_error[0]}", error=replay_error[1] or replay_error[0])
        failed = [c for c in checks if c.status is CheckStatus.FAILED]
        if failed:
            first = next(f for c in failed for f in c.findings if f.severity is Severity.ERROR)
            return finish("failed", ExitCode.FAILED, message=first.message)
        breaches = slo_breaches(request.slo, timings)
        if breaches:
            records.set_slo_breaches(drill_id, breaches)
            return finish("slo_breach", ExitCode.SLO_BREACH, message="; ".join(b["message"] for b in breaches.values()))
        return finish("passed", ExitCode.PASSED)
    except NothingToDrill as exc:
        checks = [_nothing_to_drill_check(exc, {"root": root})]
        records.add_checks(drill_id, checks)
        return finish("failed", ExitCode.NOTHING_TO_DRILL, message=exc.message)
    except KeyboardInterrupt:
        finish("aborted", ExitCode.INTERRUPTED, message="interrupted")
        raise
    except DrillError:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded as `error`, with its traceback
        return finish(
            "error",
            ExitCode.ERROR,
            message=f"{type(exc).__name__}: {exc}".splitlines()[0],
            error=traceback.format_exc(),
        )


def slo_breaches(slo: SLO | None, timings: Timings) -> dict[str, dict]:
    """The policy's SLO targets this drill missed (empty when none, or no SLO)."""
    if slo is None:
        return {}
    out: dict[str, dict] = {}
    if slo.max_restore_seconds is not None and (timings.restore or 0) > slo.max_restore_seconds:
        out["restore"] = {
            "target": slo.max_restore_seconds,
            "actual": timings.restore,
            "message": f"restore took {timings.restore:.2f} s, over the {slo.max_restore_seconds:g} s target",
        }
    if slo.max_ttfs_seconds is not None:
        if timings.ttfs is None:
            out["ttfs"] = {"target": slo.max_ttfs_seconds, "actual": None, "message": "time to first step was not measured (no replay)"}
        elif timings.ttfs > slo.max_ttfs_seconds:
            out["ttfs"] = {
                "target": slo.max_ttfs_seconds,
                "actual": timings.ttfs,
                "message": f"time to first step {timings.ttfs:.2f} s, over the {slo.max_ttfs_seconds:g} s target",
            }
    return out


def _restored_step(restore: RestoreResult, ref: CheckpointRef) -> int | None:
    step = restore.state.get("train_state.step")
    if hasattr(step, "item"):
        step = step.item()
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else ref.step


def _replay(
    request: DrillRequest,
    restore: RestoreResult,
    root: str,
    ref: CheckpointRef,
    step: int | None,
    device,  # type: ignore[no-untyped-def]
    started: float,
    timings: Timings,
) -> ReplayOutcome:
    if restore.metadata_error is not None or restore.failures:
        return ReplayOutcome(verdict="not replayable", reason="not attempted: the checkpoint did not restore cleanly")
    if ref.format != "dcp" and request.replay.entrypoint is None:
        return ReplayOutcome(
            verdict="not replayable", reason=f"no replay entrypoint for this {ref.format} checkpoint: pass --replay module:function"
        )
    run_dir = root if ref.uri != root else os.path.dirname(root.rstrip("/"))
    outcome = run_replay(spec=request.replay, run_dir=run_dir, checkpoint=ref.uri, step=step, device=str(device))
    if outcome.first_step_at is not None:
        timings.ttfs = outcome.first_step_at - started
    return outcome


def _integrity(storage: Storage, plan: IntegrityPlan, restore: RestoreResult, request: DrillRequest) -> CheckResult:
    """The integrity check over the bytes the restore read (and hashed) in its one pass."""
    started = time.perf_counter()
    observed = {
        f.relative_path: Observed(hashes=f.hashes, error=f.error)
        for f in restore.files
        if f.hashes is not None or f.error is not None
    }
    hash_remaining(storage, plan, observed)
    structure = restore.structure
    if structure is None and plan.manifest is None and restore.index is not None:
        structure = dcp_structure(restore.index, plan.on_storage)
    result = integrity_check(plan, observed, require_sealed=request.require_sealed, structure=structure)
    result.seconds = time.perf_counter() - started
    return result


def _discovery_summary(found, ref: CheckpointRef) -> str:  # type: ignore[no-untyped-def]
    text = f"{len(found.checkpoints)} complete checkpoint(s) retained; selected {ref.name}"
    if found.incomplete:
        text += f"; {len(found.incomplete)} incomplete save(s) skipped: " + ", ".join(s.name for s in found.incomplete)
    return text
