"""What one drill is asked to do, validated before anything is read or recorded."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from drill.checks import Expectations
from drill.device import parse_device
from drill.errors import UsageError, named
from drill.formats import parse_format
from drill.integrity.sampling import SampleSpec, SampleSpecError, parse_sample
from drill.replay.spec import ReplaySpec
from drill.select import Selection, Selector, parse_selector
from drill.storage import StorageError, normalize, scheme_of
from drill.units import parse_size
from drill.verdict import SLO

TRIGGERS = ("manual", "policy", "scheduler", "resume")


@dataclass(kw_only=True, slots=True)
class DrillRequest:
    """One drill: which checkpoint, where to restore it, what it must prove.

    Strings are accepted where a parsed form exists (``selector="step:20"``,
    ``sample="25%"``); anything invalid raises :class:`~drill.errors.UsageError` here, before
    any I/O and before anything is recorded.
    """

    selector: Selector | str = "latest"
    """``latest``, ``oldest``, ``step:N`` or a checkpoint path."""
    root: str | None = None
    """The run directory; may be omitted when the selector is a checkpoint path."""
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    trigger: str = "manual"
    """Who asked: ``manual``, ``policy`` (``drill run --policy``), ``scheduler`` or ``resume``."""
    expectations: Expectations = field(default_factory=Expectations)
    sample: SampleSpec | str = "all"
    """Which files to hash; every file unless a sampled drill is asked for."""
    require_sealed: bool = False
    """Fail an unsealed checkpoint instead of accepting a structural proof."""
    storage_options: dict[str, Any] = field(default_factory=dict)
    """Object-store settings (``endpoint_url``, ``region``, ``profile``, ``addressing_style``,
    ``concurrency``, ``part_size``); the environment fills in the rest."""
    cold: bool = False
    """Drop the checkpoint's files from this host's page cache before restoring them: the
    restore reads from the storage, as a restart does (the record says cold or warm)."""
    durable: str | None = None
    """The run root's copy on a durable tier (``s3://bucket/run7``): the drilled checkpoint's
    copy there is verified against the same manifest (did the drain finish?)."""
    scratch: str | None = None
    """A local directory: a remote checkpoint is first copied there, and the copy is what gets
    verified and loaded (removed when the drill ends). None: read the object store directly."""
    key_file: str | None = None
    """The seal key to authenticate manifests with; None: ``$DRILL_SEAL_KEY_FILE`` or
    ``$DRILL_SEAL_KEY`` if set (see :mod:`drill.integrity.keys`)."""
    coverage_days: float = 7.0
    """Report the share of the checkpoint's bytes verified within this many days."""
    format: str = "auto"
    """Force a format adapter (``dcp``, ``torch-save``, ``lightning``, ``hf-trainer``)."""
    allow_classes: tuple[str, ...] = ()
    """Classes a layout legitimately pickles into its tensors' files (e.g. ``mytrainer.state.TrainState``)."""
    replay: ReplaySpec = field(default_factory=ReplaySpec)
    """Replay K steps after the checkpoint and compare with the original run."""
    policy: str | None = None
    """The policy's name, when a policy asked for this drill."""
    policy_file: str | None = None
    """The policy file it came from (``drill run --policy FILE`` re-runs it)."""
    selection: Selection | None = None
    """A policy's selection (retention- and settle-aware); used instead of ``selector``."""
    keep_last: int | None = None
    """The run's keep-last-K retention (a policy's ``checkpoints.keep_last``)."""
    slo: SLO | None = None
    memory_budget: int | str | None = None
    """Bytes the restored state may occupy on the device (``"16GiB"`` accepted); a checkpoint
    needing more is refused before anything is allocated. None: what the device has free."""
    timeout: float | None = 3600.0
    """Seconds the whole drill may take; past it, wherever it is, the drill ends as ``error``
    with the phase it was in (a hung mount, a storage that never answers). None: no limit."""

    def __post_init__(self) -> None:
        try:
            self._validate()
        except (ValueError, SampleSpecError, StorageError) as exc:
            raise UsageError(str(exc)) from None

    def _validate(self) -> None:
        if isinstance(self.selector, str):
            self.selector = _flag("--checkpoint", parse_selector, self.selector)
        if isinstance(self.sample, str):
            self.sample = _flag("--sample", parse_sample, self.sample)
        self.device = _flag("--device", parse_device, self.device)
        self.format = _flag("--format", parse_format, self.format)
        if self.memory_budget is not None:
            self.memory_budget = _flag("--memory-budget", parse_size, self.memory_budget)
        self.allow_classes = tuple(self.allow_classes)
        if self.trigger not in TRIGGERS:
            raise ValueError(f"unknown trigger {self.trigger!r}: expected {', '.join(TRIGGERS)}")
        if not self.coverage_days > 0:
            raise ValueError(f"--coverage-days: must be positive, not {self.coverage_days!r}")
        if self.timeout is not None and not (0 < self.timeout < float("inf")):
            raise ValueError(f"--timeout: must be a positive number of seconds, not {self.timeout!r}")
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, not {self.keep_last}")
        assert isinstance(self.selector, Selector)  # parsed above
        root_given = self.root is not None
        if self.root is not None:
            named(self.root, "drill run --root ./run")
        if self.root is None:
            if self.selector.kind != "path":
                raise ValueError(
                    f"--root is required with --checkpoint {self.selector}: only a checkpoint path names its run"
                )
            assert self.selector.path is not None
            path = self.selector.path.rstrip("/")
            self.root = path.rsplit("/", 1)[0] if "/" in path else "."
        # Records key on one spelling, so `drill history --root` finds a run however it was
        # spelled when drilled.
        scheme_of(self.root)
        self.root = normalize(self.root)
        if self.durable is not None:
            self.durable = normalize(self.durable)
            if self.durable == self.root:
                raise ValueError(f"--durable {self.durable} is the run root itself: name the other tier's copy")
        if self.selector.kind == "path" and "://" not in str(self.selector.path):
            path = str(self.selector.path)
            self.selector = Selector("path", path=_under_root(path, self.root) if root_given else normalize(path))

    def flags(self) -> list[str]:
        """The ``drill run`` flags that ask for this drill again, the way it was asked for —
        every option that differs from its default (the checkpoint itself excluded: a re-run
        names the one that was drilled). What reports print as "Re-run"."""
        out: list[str] = []
        d = _DEFAULTS
        for flag_, value, default in (
            ("--device", self.device, d.device), ("--format", self.format, d.format), ("--finite-scan", self.expectations.finite_scan, d.expectations.finite_scan),
            ("--sample", str(self.sample), str(d.sample)), ("--key-file", self.key_file, None), ("--coverage-days", self.coverage_days, d.coverage_days),
            ("--timeout", self.timeout, d.timeout), ("--memory-budget", self.memory_budget, None), ("--durable", self.durable, None),
        ):  # fmt: skip
            if value is not None and value != default:
                out += [flag_, f"{value:g}" if isinstance(value, float) else str(value)]
        out += [a for part in self.expectations.allow_missing for a in ("--allow-missing", part)]
        out += [a for name in self.allow_classes for a in ("--allow-class", name)]
        if self.require_sealed:
            out.append("--require-sealed")
        if self.cold:
            out.append("--cold")
        return out + _replay_flags(self.replay, d.replay)

    def options(self) -> dict[str, Any]:
        """What the drill's record keeps of how it was asked for: the flags that repeat it, the
        policy file, and the parts it accepted as missing (what a pass did not prove)."""
        return {
            "flags": self.flags(),
            "policy_file": self.policy_file,
            "allow_missing": list(self.expectations.allow_missing),
            "required_parts": list(self.expectations.required_parts)
            if self.expectations.required_parts is not None
            else None,
            "replay": self.replay.enabled,
            "slo": self.slo.to_dict() if self.slo is not None else None,
            "cold": self.cold,
        }


def _replay_flags(spec: ReplaySpec, default: ReplaySpec) -> list[str]:
    if not spec.enabled:
        return ["--no-replay"]
    out = ["--replay", spec.entrypoint] if spec.entrypoint else []
    if spec.steps != default.steps:
        out += ["--replay-steps", str(spec.steps)]
    if spec.timeout != default.timeout:
        out += ["--replay-timeout", f"{spec.timeout:g}"]
    if spec.tolerance is not None:
        out += ["--rtol", f"{spec.tolerance.rtol:g}", "--atol", f"{spec.tolerance.atol:g}"]
    return out


def _under_root(path: str, root: str) -> str:
    """A checkpoint named relative to ``--root`` (``--root RUN --checkpoint step-20``), unless
    it is a path from the working directory that exists there and not under the root."""
    if os.path.isabs(path):
        return normalize(path)
    under = f"{root.rstrip('/')}/{path}"
    if "://" in root:
        return normalize(under)
    if os.path.lexists(under) or not os.path.lexists(path):
        return normalize(under)
    return normalize(path)


def _flag(name: str, parse, value):  # type: ignore[no-untyped-def]
    """Parse one field; its error names the flag (``--device: unknown device 'tpu' …``)."""
    try:
        return parse(value)
    except (ValueError, SampleSpecError) as exc:
        raise UsageError(f"{name}: {exc}") from None


_DEFAULTS = DrillRequest(root="/")  # only its options are read: no working directory asked for
