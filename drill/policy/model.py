"""What a policy says, as typed dataclasses that validate themselves.

Every ``__post_init__`` rejects a bad value or combination with a sentence saying why; it
raises :class:`FieldError` naming the field, so the loader can point at the line. The units
(durations in seconds, sizes in bytes) are already parsed here: :mod:`drill.policy.load`
turns ``"10m"`` and ``"16GiB"`` into numbers with the same parsers the CLI flags use.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from drill import parts
from drill.checks import FINITE_SCANS
from drill.device import parse_device
from drill.formats import parse_format
from drill.integrity.sampling import SampleSpecError, parse_sample
from drill.policy.cron import cron_trigger
from drill.replay.spec import ENTRYPOINT
from drill.select import Selection
from drill.verdict import FINAL, SLO, DrillStatus

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+\Z")


SLURM_NAMES = re.compile(r"[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
QUALIFIED = re.compile(
    r"(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
"""A Kubernetes label key or resource name: an optional DNS-subdomain prefix and ``/``, a name of at most 63."""
LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
EXTENDED_RESOURCE = re.compile(r"[a-z0-9.-]+\.[a-z0-9-]+/.+")
"""Extended resources are named within a domain (``nvidia.com/gpu``)."""
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _toleration_problem(tol: Any) -> str | None:
    """What the API would refuse in one toleration (None: nothing)."""
    if not isinstance(tol, dict) or not tol:
        return "a mapping of key, operator, value, effect, tolerationSeconds"
    unknown = sorted(set(map(str, tol)) - TOLERATION_KEYS)
    if unknown:
        return f"unknown field {unknown[0]!r} (expected {', '.join(sorted(TOLERATION_KEYS))})"
    operator = tol.get("operator", "Equal")
    if operator not in ("Equal", "Exists"):
        return f"operator {operator!r}: Equal or Exists"
    key, value = tol.get("key", ""), tol.get("value", "")
    if not isinstance(key, str) or (key and not QUALIFIED.fullmatch(key)) or (not key and operator != "Exists"):
        return f"key {key!r}: a taint key ([prefix/]name); empty only with operator Exists"
    if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value) or (value and operator == "Exists"):
        return f"value {value!r}: a label value, and none with operator Exists"
    effect = tol.get("effect", "")
    if effect and effect not in TAINT_EFFECTS:
        return f"effect {effect!r}: one of {', '.join(TAINT_EFFECTS)}"
    seconds = tol.get("tolerationSeconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int) or effect != "NoExecute"):
        return "tolerationSeconds: a whole number of seconds, with effect NoExecute only"
    return None


class FieldError(ValueError):
    """A policy value that cannot be used; ``field`` is its key within its section."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field


def _positive(name: str, value: float | int | None) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise FieldError(name, f"must be positive, got {value!r}")


def _addressable(name: str, uri: str | None) -> None:
    """A storage URI some backend can address (a known scheme, a bucket named): on no host
    could a policy naming ``gs://…`` or ``s3://`` without a bucket run."""
    from drill.storage import Unaddressable, normalize

    if uri and "://" in uri:
        try:
            normalize(uri)
        except Unaddressable as exc:
            raise FieldError(name, str(exc)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoints:
    root: str
    """Run directory: a local path (relative to the policy file) or a storage URI."""
    format: str = "auto"
    """``auto``, ``dcp``, ``torch-save``, ``lightning`` or ``hf-trainer``."""
    keep_last: int | None = None
    """The run's keep-last-K retention: the checkpoint it will purge next is never drilled."""
    durable: str | None = None
    """The run's copy on a durable tier (``s3://bucket/run7``), verified against the same
    manifest as the drilled checkpoint: did the drain finish, is the copy identical?"""
    cold: bool = False
    """Drop the checkpoint's pages from the page cache before the restore: a cold read from
    the storage, as a restart's (R for goodput comes from cold drills)."""
    scratch: str | None = None
    """A local directory: a remote checkpoint is copied there first, and the copy is verified
    and loaded (removed afterwards). None: read the object store directly, no temporary file."""
    s3: dict[str, Any] = field(default_factory=dict)
    """Object-store settings for ``s3://`` roots: ``endpoint_url``, ``region``, ``profile``,
    ``addressing_style`` (auto, path, virtual), ``concurrency``, ``part_size``. Credentials come
    from the environment or the shared AWS config, never from a policy."""

    def __post_init__(self) -> None:
        if not self.root.strip():
            raise FieldError("root", "must name the run directory")
        for name in ("root", "durable"):
            _addressable(name, getattr(self, name))
        if self.s3:
            from drill.storage.s3 import S3Config

            unknown = set(self.s3) - set(S3Config.__dataclass_fields__) - {"retry_seconds", "max_attempts", "timeout"}
            if unknown:
                raise FieldError(
                    "s3", f"unknown setting(s) {', '.join(sorted(unknown))} (credentials belong in the environment)"
                )
            try:
                S3Config.from_env(**self.s3)
            except (TypeError, ValueError) as exc:
                raise FieldError("s3", str(exc)) from None
        try:
            parse_format(self.format)
        except ValueError as exc:
            raise FieldError("format", str(exc)) from None
        if self.keep_last is not None and self.keep_last < 1:
            raise FieldError("keep_last", f"must be at least 1 (keep-last-{self.keep_last} would keep nothing)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    cron: str
    """A crontab expression: 5 fields, or 6 with seconds first."""
    timezone: str = "UTC"
    """An IANA time zone the cron expression is read in."""
    start_window: float = 3600.0
    """Misfire grace in seconds: a run missed by less than this still starts (coalesced to one)."""

    def __post_init__(self) -> None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise FieldError("timezone", f"unknown timezone {self.timezone!r}") from None
        try:
            cron_trigger(self.cron, self.timezone)
        except ValueError as exc:
            raise FieldError("cron", f"invalid cron expression {self.cron!r}: {exc}") from None
        _positive("start_window", self.start_window)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contract:
    allow_missing: tuple[str, ...] = ()
    """Parts whose absence is accepted (e.g. ``rng`` for a run without dropout)."""
    require: tuple[str, ...] | None = None
    """Parts that must be present, replacing what the checkpoint's format requires."""
    finite_scan: str = "full"
    """NaN/Inf scan of weights and moments: ``full``, ``sampled`` (≤ 64 Ki elements a tensor) or ``off``."""
    allow_classes: tuple[str, ...] = ()
    """Classes a layout legitimately pickles (``module.Class``), allow-listed for the unpickler."""

    def __post_init__(self) -> None:
        for name in ("allow_missing", "require"):
            bad = [p for p in getattr(self, name) or () if p not in parts.CANONICAL_PARTS]
            if bad:
                raise FieldError(
                    name, f"unknown part(s) {', '.join(bad)} (expected {', '.join(parts.CANONICAL_PARTS)})"
                )
        if self.finite_scan not in FINITE_SCANS:
            raise FieldError("finite_scan", f"unknown value {self.finite_scan!r} (expected {', '.join(FINITE_SCANS)})")
        bad = [c for c in self.allow_classes if not DOTTED.match(c)]
        if bad:
            raise FieldError("allow_classes", f"{bad[0]!r} is not a dotted module.Class name")


@dataclass(frozen=True, slots=True, kw_only=True)
class Integrity:
    require_sealed: bool = False
    """Fail a checkpoint without a drill manifest instead of accepting a structural proof."""
    sample: str = "all"
    """Which files to hash: ``all``, ``n/t``, ``P%``, a size, ``auto[:P%|:SIZE]``."""
    coverage_days: float = 7.0
    """Report the share of the checkpoint's bytes verified within this many days."""
    key_file: str | None = None
    """A file holding the seal key: manifests must carry its HMAC (a keyed seal). The key
    stays in the file; the policy names only where it is."""

    def __post_init__(self) -> None:
        try:
            parse_sample(self.sample)
        except SampleSpecError as exc:
            raise FieldError("sample", str(exc)) from None
        _positive("coverage_days", self.coverage_days)


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    enabled: bool = True
    """Replay steps after the checkpoint and compare them with the original run."""
    entrypoint: str | None = None
    """``module:function`` that builds the training objects; default: the one the run's
    ``run.json`` names (run only if its code lies outside the run directory)."""
    steps: int = 5
    """K: optimizer steps to replay."""
    rtol: float | None = None
    """Relative tolerance for loss and grad norm (default: exact on the same device type)."""
    atol: float | None = None
    """Absolute tolerance for loss and grad norm."""
    timeout: float = 300.0
    """Wall-clock seconds for the replay (child start, restore, K steps)."""
    ranks: int | None = None
    """Processes that replay; default as many as saved the checkpoint (another number reshards)."""
    python: str | None = None
    """A candidate environment's interpreter to replay under (a newer torch, the next trainer
    commit); relative to the policy file's directory."""

    def __post_init__(self) -> None:
        if self.ranks is not None and self.ranks < 1:
            raise FieldError("ranks", f"must be at least 1, got {self.ranks}")
        if self.entrypoint is not None and not ENTRYPOINT.match(self.entrypoint):
            raise FieldError("entrypoint", f"{self.entrypoint!r} must be module:function or path/to/file.py:function")
        if self.steps < 1:
            raise FieldError("steps", f"must be at least 1, got {self.steps}")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise FieldError(name, f"must be a finite number ≥ 0, got {value!r}")
        _positive("timeout", self.timeout)


@dataclass(frozen=True, slots=True, kw_only=True)
class Alerts:
    webhook: str | None = None
    """URL to POST a JSON payload to (Slack-compatible ``text``). ``env:NAME`` reads it from
    the environment, so the secret in it stays out of the policy file."""
    command: str | None = None
    """A command run with the payload on stdin."""
    timeout: float = 10.0
    """Seconds for each delivery attempt."""
    retries: int = 3
    """Attempts per webhook delivery."""
    on: tuple[str, ...] = tuple(s.value for s in FINAL if s is not DrillStatus.PASSED)
    """The drill statuses that alert."""

    def __post_init__(self) -> None:
        if self.webhook is not None and not (
            self.webhook.startswith(("http://", "https://")) or re.match(r"^env:\w+$", self.webhook)
        ):
            raise FieldError("webhook", "must be an http(s) URL or env:NAME")
        _positive("timeout", self.timeout)
        if self.retries < 1:
            raise FieldError("retries", f"must be at least 1, got {self.retries}")
        known = [s.value for s in FINAL]
        bad = [s for s in self.on if s not in known]
        if bad:
            raise FieldError("on", f"unknown status(es) {', '.join(bad)} (expected {', '.join(known)})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    timeout: float = 3600.0
    """Wall-clock limit for the whole drill (its child process is killed past it)."""
    memory: int | None = None
    """Address-space limit for the drill's child process, in bytes."""

    def __post_init__(self) -> None:
        _positive("timeout", self.timeout)
        _positive("memory", self.memory)


LAUNCHERS = ("local", "slurm", "k8s")


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """Where the drill runs: here, or as a batch job of ``nodes × ranks_per_node`` ranks."""

    launcher: str = "local"
    """``local`` (this host), ``slurm`` (``drill submit`` and the scheduler submit a batch
    job) or ``k8s`` (``drill submit`` renders an indexed Job to apply)."""
    nodes: int = 1
    ranks_per_node: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    time_limit: float | None = None
    """The job's time limit; default: the policy's ``limits.timeout`` plus 10 minutes."""
    queue_timeout: float = 3600.0
    """A job still pending after this long is cancelled and the drill recorded as an error."""
    rendezvous: str | None = None
    """A directory every node sees (a shared filesystem) for the ranks' ``file://``
    rendezvous; required for more than one node."""
    log_dir: str | None = None
    """Slurm: where the job's output goes (``drill-<jobid>.out``); default: the directory
    ``drill submit`` runs in."""
    sbatch_args: tuple[str, ...] = ()
    """Extra ``sbatch`` options, e.g. ``["--qos=low", "--constraint=h100"]``."""
    image: str | None = None
    """Kubernetes: the container image with drill installed."""
    namespace: str | None = None
    volume_claim: str | None = None
    """Kubernetes: the PersistentVolumeClaim holding the checkpoint root, mounted read-only at
    ``checkpoints.root`` (allowed at the ``restricted`` Pod Security level)."""
    host_path: str | None = None
    """Kubernetes: a node directory mounted read-only at ``checkpoints.root`` instead (needs a
    namespace at the ``privileged`` Pod Security level: prefer ``volume_claim``)."""
    s3_secret: str | None = None
    """Kubernetes: a Secret whose keys (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, …)
    become the pods' environment, for an ``s3://`` root."""
    database_secret: str = "drill-database"
    """Kubernetes: the Secret holding the record database's URL under the key ``url``."""
    cpu: float | None = None
    """Kubernetes: CPUs each pod requests; default one per rank."""
    memory: int | None = None
    """Kubernetes: memory each pod requests and is limited to; default ``limits.memory``, else 4 GiB."""
    run_as_user: int = 1000
    """Kubernetes: the non-root user the pods run as."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Kubernetes: node labels the pods must land on (``{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}``)."""
    tolerations: tuple[dict[str, Any], ...] = ()
    """Kubernetes: taints the pods tolerate (``key``, ``operator``, ``value``, ``effect``,
    ``tolerationSeconds``), as the API spells them; pods asking for GPUs also tolerate
    ``<gpu_resource>:NoSchedule``, the taint GPU pools carry."""
    gpu_resource: str = "nvidia.com/gpu"
    """Kubernetes: the extended resource ``gpus_per_node`` asks for (``amd.com/gpu``, …)."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise FieldError("launcher", f"{self.launcher!r}: expected one of {', '.join(LAUNCHERS)}")
        for name in ("nodes", "ranks_per_node"):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be at least 1, got {getattr(self, name)}")
        if self.gpus_per_node < 0:
            raise FieldError("gpus_per_node", f"must be 0 or more, got {self.gpus_per_node}")
        _positive("time_limit", self.time_limit)
        _positive("queue_timeout", self.queue_timeout)
        if self.nodes > 1 and self.launcher == "slurm" and not self.rendezvous:
            raise FieldError(
                "rendezvous", "required for more than one node: a directory on a filesystem every node mounts"
            )
        if self.launcher == "k8s" and not self.image:
            raise FieldError("image", "required for k8s: the container image with drill installed")
        if self.volume_claim and self.host_path:
            raise FieldError("host_path", "give volume_claim or host_path, not both")
        _positive("cpu", self.cpu)
        _positive("memory", self.memory)
        if self.run_as_user < 1:
            raise FieldError("run_as_user", f"must be a non-root uid (1 or more), got {self.run_as_user}")
        bad = [a for a in self.sbatch_args if not a.startswith("--")]
        if bad:
            raise FieldError("sbatch_args", f"{bad[0]!r}: give long options, e.g. --qos=low")
        self._grammar()

    def _grammar(self) -> None:
        """Every field that reaches a batch script or a manifest, to its grammar: data, never a
        line of its own (a newline in a partition was a command in the script) or a name the
        cluster would read otherwise."""
        for name in ("partition", "account"):
            value = getattr(self, name)
            if value is not None and not SLURM_NAMES.fullmatch(value):
                raise FieldError(
                    name, f"{value!r}: a Slurm {name} name (letters, digits, '.', '_', '-'; a comma between several)"
                )
        for i, arg in enumerate(self.sbatch_args):
            if CONTROL.search(arg):
                raise FieldError(
                    "sbatch_args", f"item {i} holds a control character (a newline would be a line of the script)"
                )
        for name in ("rendezvous", "log_dir", "host_path", "image"):
            value = getattr(self, name)
            if value is not None and (not value or CONTROL.search(value)):
                raise FieldError(name, f"{value!r}: empty, or holds a control character")
        if self.image is not None and any(c.isspace() for c in self.image):
            raise FieldError("image", f"{self.image!r}: an image reference holds no spaces")
        if self.namespace is not None and not DNS_LABEL.fullmatch(self.namespace):
            raise FieldError(
                "namespace", f"{self.namespace!r}: a Kubernetes namespace (a DNS label: a-z, 0-9, '-', at most 63)"
            )
        for name in ("volume_claim", "s3_secret", "database_secret"):
            value = getattr(self, name)
            if value is not None and not (DNS_SUBDOMAIN.fullmatch(value) and len(value) <= 253):
                raise FieldError(name, f"{value!r}: a Kubernetes object name (a-z, 0-9, '-', '.', at most 253)")
        if self.host_path is not None and (not self.host_path.startswith("/") or ".." in self.host_path.split("/")):
            raise FieldError("host_path", f"{self.host_path!r}: an absolute path on the node, without '..'")
        self._scheduling()

    def _scheduling(self) -> None:
        """Node selector, tolerations and the GPU resource, to the API's grammar."""
        for key, value in self.node_selector.items():
            if not QUALIFIED.fullmatch(key):
                raise FieldError("node_selector", f"{key!r}: a label key ([prefix/]name, name at most 63 characters)")
            if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
                raise FieldError(
                    "node_selector", f"{key}: {value!r} is not a label value (at most 63: a-z, 0-9, '-', '_', '.')"
                )
        if not (EXTENDED_RESOURCE.fullmatch(self.gpu_resource) and QUALIFIED.fullmatch(self.gpu_resource)):
            raise FieldError(
                "gpu_resource", f"{self.gpu_resource!r}: an extended resource name (domain/name, e.g. nvidia.com/gpu)"
            )
        for i, tol in enumerate(self.tolerations):
            why = _toleration_problem(tol)
            if why:
                raise FieldError("tolerations", f"item {i}: {why}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    name: str
    """One scheduler job per name: letters, digits, ``.``, ``_``, ``-``."""
    checkpoints: Checkpoints
    path: str = ""
    """The file it was loaded from."""
    source: str = field(default="", repr=False, compare=False)
    """The text it was parsed from: what a Kubernetes ConfigMap carries to the pods, so they run
    the policy that was checked here, not the file as it is by then."""
    selection: Selection = field(default_factory=Selection)
    schedule: Schedule | None = None
    """When to drill; a policy without one runs by hand or from cron only."""
    contract: Contract = field(default_factory=Contract)
    integrity: Integrity = field(default_factory=Integrity)
    replay: Replay = field(default_factory=Replay)
    slo: SLO = field(default_factory=SLO)
    alerts: Alerts = field(default_factory=Alerts)
    device: str = "auto"
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    limits: Limits = field(default_factory=Limits)
    allocation: Allocation = field(default_factory=Allocation)

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise FieldError("name", f"{self.name!r}: use letters, digits, '.', '_' and '-'")
        try:
            parse_device(self.device)
        except ValueError as exc:
            raise FieldError("device", str(exc)) from None
        a = self.allocation
        if a.launcher == "k8s" and "://" not in self.checkpoints.root and not (a.volume_claim or a.host_path):
            raise FieldError(
                "allocation.volume_claim",
                "required for k8s with a filesystem root: the claim holding it (or allocation.host_path)",
            )
        if a.launcher == "k8s" and "://" not in self.checkpoints.root and not self.checkpoints.root.startswith("/"):
            raise FieldError("checkpoints.root", "must be an absolute path for k8s: the volume is mounted there")
