"""What drill claims about a checkpoint — each claim defined once, and asked by everything that
shows it (``run``, ``verify``, ``show``, ``history``, ``last-good``, reports, metrics, the SDK).

An auditor is worth exactly the trust in what it claims, so a claim never says more than was
proven:

- **evidence** — what a drill's integrity proof rests on, weakest to strongest:

  ==================  =======================================================================
  ``none``            nothing about the bytes was proven (no seal, no structure the format has)
  ``structural``      no content digests; the files agree with the format's own index (DCP
                      offsets, torch.save's CRC-32s, safetensors headers)
  ``sealed``          every byte (or a sample of them) matched content digests written with
                      the checkpoint (drill's manifest, Megatron's ``integrity.json``)
  ``authenticated``   sealed, and the seal carries the HMAC of the configured key
  ==================  =======================================================================

- **a pass** carries its evidence and its replay verdict wherever it is shown (:class:`Proof`);
- **last good** is the newest retained checkpoint whose latest drill passed on at least the
  evidence asked for (:func:`good_enough`; ``structural`` unless said otherwise);
- **coverage** is bytes proven within a window over bytes retained on storage, naming the
  checkpoints never drilled (:class:`Coverage`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drill.findings import CheckResult

LEVELS = ("none", "structural", "sealed", "authenticated")
"""Evidence levels, weakest first."""
DEFAULT_MIN_EVIDENCE = "structural"
"""What ``last-good`` asks of a pass unless told otherwise."""
_LEGACY = {"unsealed": "structural"}
"""Levels as drill before 0.5 recorded them (every unsealed drill had its format's structure)."""

DESCRIBED = {
    "none": "no proof of the bytes",
    "structural": "structurally consistent, no content hashes",
    "sealed": "sealed, unauthenticated",
    "authenticated": "sealed and authenticated",
}


def level(*, sealed: bool, authenticated: bool = False, structural: bool = False) -> str:
    """The evidence level of a proof that was ``sealed`` (content digests), ``authenticated``
    (by the seal key) and/or ``structural``."""
    if sealed:
        return "authenticated" if authenticated else "sealed"
    return "structural" if structural else "none"


def parse_level(text: str) -> str:
    """A level as given on a command line or in a policy; ``ValueError`` names the choices."""
    value = str(text).strip().lower()
    if value not in LEVELS:
        raise ValueError(f"unknown evidence level {text!r}: expected one of {', '.join(LEVELS)}")
    return value


def normalized(stored: str | None) -> str:
    """A recorded level, read the way this drill defines them (older records included)."""
    value = _LEGACY.get(stored or "", stored or "none")
    return value if value in LEVELS else "none"


def at_least(stored: str | None, minimum: str) -> bool:
    return LEVELS.index(normalized(stored)) >= LEVELS.index(parse_level(minimum))


def evidence_of(integrity: CheckResult | None) -> str:
    """The level an ``integrity`` check proved (``none`` when it did not run)."""
    if integrity is None:
        return "none"
    stored = integrity.evidence.get("level")
    if stored in LEVELS:
        return str(stored)
    return normalized(integrity.evidence.get("evidence_level"))


# -- a record as sealed ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RecordSeal:
    """Whether a drill's record, as read, is the record that was sealed into the audit log
    (:func:`drill.records.audit.attest`): ``intact``; ``open`` (still running: nothing sealed
    yet); or ``broken`` — edited, deleted, inserted or resealed outside drill, ``code`` and
    ``message`` say how. A broken record is evidence of nothing: no claim rests on it."""

    state: str
    code: str | None = None
    message: str | None = None
    entry: int | None = None
    """The audit log entry the record was checked against."""

    @property
    def broken(self) -> bool:
        return self.state == "broken"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "code": self.code, "message": self.message, "entry": self.entry}


# -- what a drill proved ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Proof:
    """What one drill's verdict rests on: the words every view of a drill uses."""

    status: str
    evidence: str
    replay: str
    """The replay's verdict (``passed``, ``diverged``, ``not replayable``, ``error``), or ``not run``."""
    sample: str | None = None
    allowed_missing: tuple[str, ...] = ()
    """Parts a pass accepted as missing (``--allow-missing``): what it did not prove."""
    record: str | None = None
    """The record's seal as read (:class:`RecordSeal` state); None where it was not read back."""
    environment: str | None = None
    """Where the replay ran: ``current`` (drill's own environment) or ``candidate (…what
    changed…)`` (``--python``); None where no replay ran."""

    @property
    def restorable_under(self) -> str:
        """``current``, ``candidate (torch 2.13.0 → 2.14.0)``, or ``–``: the environment a passed
        replay proved the checkpoint resumes under."""
        return self.environment if self.replayed and self.environment else "–"

    @property
    def replayed(self) -> bool:
        return self.replay == "passed"

    def describe(self) -> str:
        """``passed — sealed and authenticated; replay passed``: one phrase for a person."""
        parts = [DESCRIBED[self.evidence]]
        if self.sample not in (None, "all"):
            parts.append(f"sampled {self.sample}")
        parts.append(f"replay {self.replay}")
        if self.allowed_missing:
            parts.append(f"accepted missing: {', '.join(self.allowed_missing)}")
        if self.record == "broken":
            parts.append("RECORD FAILS ITS AUDIT SEAL: evidence of nothing")
        return f"{self.status} — " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "evidence": self.evidence,
            "replay": self.replay,
            "sample": self.sample,
            "allowed_missing": list(self.allowed_missing),
            "restorable_under": self.restorable_under,
        }


def proof_of(outcome: Any) -> Proof:
    """What a :class:`~drill.pipeline.outcome.DrillOutcome` proved (duck-typed: the claims sit
    below the pipeline that makes outcomes)."""
    allowed = tuple((outcome.options or {}).get("allow_missing") or ())
    return Proof(
        status=outcome.status.value,
        evidence=normalized(outcome.evidence_level),
        replay=outcome.replay.verdict if outcome.replay is not None else "not run",
        sample=outcome.sample,
        allowed_missing=allowed,
        record=outcome.seal.state if getattr(outcome, "seal", None) is not None else None,
        environment=_replayed_under(outcome),
    )


def _replayed_under(outcome: Any) -> str | None:
    """``current`` or ``candidate (…)``, from the replay check's evidence; None without one."""
    check = next((c for c in getattr(outcome, "checks", None) or [] if c.name == "replay"), None)
    environment = (check.evidence or {}).get("environment") if check is not None else None
    if not isinstance(environment, dict):
        return None
    candidate = environment.get("candidate")
    if not isinstance(candidate, dict):
        return "current"
    changed = environment.get("changed") or {}
    shown = ", ".join(f"{name} {was} → {now}" for name, (was, now) in list(changed.items())[:3])
    return f"candidate ({shown or 'same versions, its own code'})"


def good_enough(outcome: Any, *, min_evidence: str = DEFAULT_MIN_EVIDENCE, require_replay: bool = False) -> bool:
    """Whether a drill's pass is one ``last-good`` may vouch for: never one whose record fails its seal."""
    proof = proof_of(outcome)
    return (
        proof.status == "passed"
        and proof.record != "broken"
        and at_least(proof.evidence, min_evidence)
        and (proof.replayed or not require_replay)
    )


# -- coverage -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Retained:
    """One retained checkpoint as coverage counts it."""

    name: str
    bytes_on_storage: int | None
    """What storage holds now (None: it could not be listed)."""
    drilled_in_window: bool
    bytes_proven_in_window: int
    """Bytes whose content matched their seal within the window (the coverage ledger)."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of a run's retained state was proven within a window."""

    checkpoints: Sequence[Retained] = field(default_factory=tuple)

    @property
    def retained(self) -> int:
        return len(self.checkpoints)

    @property
    def drilled_in_window(self) -> int:
        return sum(1 for c in self.checkpoints if c.drilled_in_window)

    @property
    def never_drilled(self) -> list[str]:
        """Retained checkpoints no drill touched within the window."""
        return [c.name for c in self.checkpoints if not c.drilled_in_window]

    @property
    def bytes_retained(self) -> int:
        return sum(c.bytes_on_storage or 0 for c in self.checkpoints)

    @property
    def bytes_unknown(self) -> list[str]:
        """Checkpoints whose size on storage is not known (it could not be listed)."""
        return [c.name for c in self.checkpoints if c.bytes_on_storage is None]

    @property
    def bytes_proven_in_window(self) -> int:
        return sum(
            min(
                c.bytes_proven_in_window,
                c.bytes_on_storage if c.bytes_on_storage is not None else c.bytes_proven_in_window,
            )
            for c in self.checkpoints
        )

    @property
    def share(self) -> float | None:
        return self.drilled_in_window / self.retained if self.retained else None

    @property
    def share_bytes(self) -> float | None:
        """Bytes proven / bytes retained; None when nothing is retained or a size is unknown
        (a share of an unknown total would overstate)."""
        if not self.bytes_retained or self.bytes_unknown:
            return None
        return self.bytes_proven_in_window / self.bytes_retained

    def describe(self) -> tuple[str, str]:
        """(checkpoints, bytes): the two sentences every view of coverage prints."""
        from drill.units import human_bytes

        def pct(v: float | None) -> str:
            return f"{100 * v:.0f}%" if v is not None else "–"

        never = f"; never drilled: {', '.join(self.never_drilled)}" if self.never_drilled else ""
        ckpts = f"{self.drilled_in_window} of {self.retained} retained checkpoints drilled in the window ({pct(self.share)}{never})"
        unknown = f"; size unknown for {', '.join(self.bytes_unknown)} (not listed)" if self.bytes_unknown else ""
        data = (
            f"{human_bytes(self.bytes_proven_in_window)} of {human_bytes(self.bytes_retained)} on storage proven against their seals "
            f"in the window ({pct(self.share_bytes)}{unknown})"
        )
        return ckpts, data

    def to_dict(self) -> dict[str, Any]:
        return {
            "retained": self.retained, "drilled_in_window": self.drilled_in_window, "share": self.share,
            "never_drilled": self.never_drilled, "bytes_retained": self.bytes_retained,
            "bytes_verified_in_window": self.bytes_proven_in_window, "share_bytes": self.share_bytes,
            "bytes_unknown": self.bytes_unknown,
        }  # fmt: skip


def coverage(checkpoints: Iterable[Retained]) -> Coverage:
    return Coverage(tuple(checkpoints))


__all__ = [
    "DEFAULT_MIN_EVIDENCE", "LEVELS", "Coverage", "Proof", "Retained", "at_least", "coverage", "evidence_of",
    "good_enough", "level", "normalized", "parse_level", "proof_of",
]  # fmt: skip
