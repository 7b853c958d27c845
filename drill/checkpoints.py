"""What a checkpoint is to drill: a reference to a complete save, an unfinished one, what a run
retains — and how a step number is read from a name, where a format names its saves that way.

Plain data, imported by every layer: which checkpoints a directory holds is each format's
business (:mod:`drill.formats`), listing a run is :mod:`drill.discover`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SINGLE_FILE_SUFFIXES = (".pt", ".pth", ".ckpt", ".tar")

# How writers name a save by its step: torchtitan's step-N, the Trainer's checkpoint-N, Megatron's
# iter_0000800, DeepSpeed's global_stepN, ckpt_000008, Composer's ep1-ba8(-rank0), Lightning's
# epoch=1-step=8.
_STEP_NAMES = (
    re.compile(r"^(?:step|checkpoint|ckpt|iter|iteration|global_step)[-_=]?(\d+)\Z", re.ASCII),
    re.compile(r"^ep\d+-ba(\d+)(?:-rank\d+)?\Z", re.ASCII),
    re.compile(r"(?:^|[-_])step=(\d+)\Z", re.ASCII),
)
# Single files also carry it inside a longer name: "model_step_400.pt", "run-iter-400.pt".
_STEP_FILE = re.compile(r"(?:^|[-_])(?:step|iter|global_step)[=_-]?(\d+)\Z", re.ASCII)


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    uri: str
    name: str
    step: int | None
    format: str
    """The name of the :mod:`drill.formats` format that recognized it."""
    mtime: float


@dataclass(frozen=True, slots=True)
class IncompleteSave:
    uri: str
    name: str
    step: int | None
    reason: str


@dataclass(slots=True)
class Discovery:
    root: str
    checkpoints: list[CheckpointRef] = field(default_factory=list)
    """Complete saves, oldest step first."""
    incomplete: list[IncompleteSave] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)
    """Files of a final model export beside the checkpoints: not resumable, not drilled."""

    @property
    def saves(self) -> list[CheckpointRef | IncompleteSave]:
        """Every save under the root, complete or not (what a trainer's auto-resume looks at)."""
        return [*self.checkpoints, *self.incomplete]

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self.checkpoints if c.step is not None]


def step_of(name: str) -> int | None:
    """The step a save's name carries (``step-40``, ``iter_0000040``, ``ckpt_000040``,
    ``ep1-ba40-rank0.pt``, ``epoch=0-step=40.ckpt`` — a file or a directory so named)."""
    is_file = name.endswith(SINGLE_FILE_SUFFIXES)
    stem = name.rsplit(".", 1)[0] if is_file else name
    for pattern in _STEP_NAMES:
        m = pattern.search(stem)
        if m:
            return int(m.group(1))
    m = _STEP_FILE.search(stem)
    return int(m.group(1)) if m and is_file else None


def looks_like_checkpoint_name(name: str) -> bool:
    return any(p.search(name) for p in _STEP_NAMES)


__all__ = [
    "SINGLE_FILE_SUFFIXES",
    "CheckpointRef",
    "Discovery",
    "IncompleteSave",
    "looks_like_checkpoint_name",
    "step_of",
]
