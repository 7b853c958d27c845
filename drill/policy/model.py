"""What a policy says, as typed, validated dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

SELECTIONS = ("latest", "oldest", "random", "least-recently-drilled")


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoints:
    root: str
    """Run directory (local path; ``s3://`` later)."""
    format: str = "auto"
    keep_last: int | None = None
    """The run's keep-last-K retention: the checkpoint it will purge next is never drilled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    strategy: str = "latest"
    """latest, oldest, random, least-recently-drilled — or a fixed step (``step``)."""
    step: int | None = None
    window: float | None = None
    """For ``random``: only checkpoints saved within this many seconds."""
    settle: float = 0.0
    """Skip checkpoints younger than this many seconds (a save may still be in flight)."""
    seed: int | None = None
    """For ``random``: a fixed seed; otherwise one is drawn and recorded."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    cron: str
    timezone: str = "UTC"
    start_window: float = 3600.0
    """Misfire grace: a run missed by less than this still starts (coalesced to one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Contract:
    allow_missing: tuple[str, ...] = ()
    require: tuple[str, ...] | None = None
    finite_scan: str = "full"
    allow_classes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Integrity:
    require_sealed: bool = False
    sample: str = "all"
    coverage_days: float = 7.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    enabled: bool = True
    entrypoint: str | None = None
    steps: int = 5
    rtol: float | None = None
    atol: float | None = None
    timeout: float = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SLO:
    max_restore_seconds: float | None = None
    max_ttfs_seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Alerts:
    webhook: str | None = None
    """URL to POST a JSON payload to (Slack-compatible ``text``). ``env:NAME`` reads it from
    the environment, so the secret in it stays out of the policy file."""
    command: str | None = None
    """A command run with the payload on stdin."""
    timeout: float = 10.0
    retries: int = 3
    on: tuple[str, ...] = ("failed", "error", "slo_breach", "aborted")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    timeout: float = 3600.0
    """Wall-clock limit for the whole drill (its child process is killed past it)."""
    memory: int | None = None
    """Address-space limit for the drill's child process, in bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    name: str
    checkpoints: Checkpoints
    path: str = ""
    """The file it was loaded from."""
    selection: Selection = field(default_factory=Selection)
    schedule: Schedule | None = None
    contract: Contract = field(default_factory=Contract)
    integrity: Integrity = field(default_factory=Integrity)
    replay: Replay = field(default_factory=Replay)
    slo: SLO = field(default_factory=SLO)
    alerts: Alerts = field(default_factory=Alerts)
    device: str = "auto"
    limits: Limits = field(default_factory=Limits)
