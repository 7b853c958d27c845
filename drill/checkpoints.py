"""What a checkpoint is to drill: a reference to a complete save, an unfinished one, what a run
retains — and how a step number is read from a name, where a format names its saves that way.

Plain data, imported by every layer: which checkpoints a directory holds is each format's
business (:mod:`drill.formats`), listing a run is :mod:`drill.discover`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SINGLE_FILE_SUFFIXES = (".pt", ".pth", ".ckpt", ".tar")

# torchtitan writes step-N; other trainers use checkpoint-N, iter_N, global_stepN.
_STEP_DIR = re.compile(r"^(?:step|checkpoint|iter|global_step)[-_]?(\d+)\Z", re.ASCII)
# Single files: Lightning's "epoch=0-step=400.ckpt", "step_400.pt", "iter-400.pt".
_STEP_FILE = re.compile(r"(?:^|[-_])(?:step|iter|global_step)[=_-]?(\d+)(?:\.|$)", re.ASCII)


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
    """The step a save's name carries (``step-40``, ``iter_0000040``, ``epoch=0-step=40.ckpt``)."""
    m = _STEP_DIR.match(name)
    if m:
        return int(m.group(1))
    m = _STEP_FILE.search(name)
    return int(m.group(1)) if m and name.endswith(SINGLE_FILE_SUFFIXES) else None


def looks_like_checkpoint_name(name: str) -> bool:
    return _STEP_DIR.match(name) is not None


__all__ = [
    "SINGLE_FILE_SUFFIXES",
    "CheckpointRef",
    "Discovery",
    "IncompleteSave",
    "looks_like_checkpoint_name",
    "step_of",
]
