"""Which retained checkpoint a drill restores: parsing ``--checkpoint`` and choosing.

Both are pure functions: parsing validates before any I/O, choosing works on a
:class:`~drill.discover.Discovery` already made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from drill.discover import CheckpointRef, Discovery, looks_like_checkpoint_name
from drill.errors import NothingToDrill, UsageError

FORMS = "latest, oldest, step:N or a checkpoint path"


@dataclass(frozen=True, slots=True)
class Selector:
    kind: Literal["latest", "oldest", "step", "path"]
    step: int | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.kind == "step":
            return f"step:{self.step}"
        if self.kind == "path":
            return str(self.path)
        return self.kind


def parse_selector(text: str) -> Selector:
    """Parse ``latest | oldest | step:N | PATH``; raises :class:`UsageError` on anything else."""
    t = text.strip()
    if t in ("latest", "oldest"):
        return Selector(t)  # type: ignore[arg-type]
    if t.startswith("step:"):
        num = t[len("step:") :]
        if not num.isdigit():
            raise UsageError(f"--checkpoint {text!r}: step must be a non-negative integer, as in step:1200")
        return Selector("step", step=int(num))
    if "/" in t or t.startswith(".") or looks_like_checkpoint_name(t) or t.endswith((".pt", ".pth", ".ckpt")):
        return Selector("path", path=t)
    raise UsageError(f"unknown --checkpoint form {text!r}: expected {FORMS}")


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def select(discovery: Discovery, selector: Selector) -> CheckpointRef:
    """The checkpoint ``selector`` names; raises :class:`NothingToDrill` when there is none."""
    found = discovery.checkpoints
    if not found:
        if discovery.incomplete:
            names = ", ".join(s.name for s in discovery.incomplete)
            raise NothingToDrill(
                f"no complete checkpoint under {discovery.root}: only incomplete saves ({names})",
                hint="a save still in progress finishes with .metadata; if none is running, no resume is possible",
            )
        raise NothingToDrill(f"no checkpoint under {discovery.root}", hint="is this the run directory holding step-N/?")
    if selector.kind == "latest":
        return found[-1]
    if selector.kind == "oldest":
        return found[0]
    if selector.kind == "step":
        for ref in found:
            if ref.step == selector.step:
                return ref
        for inc in discovery.incomplete:
            if inc.step == selector.step:
                raise NothingToDrill(f"step {selector.step} is an incomplete save ({inc.reason}): {inc.uri}")
        steps = ", ".join(str(r.step) for r in found)
        raise NothingToDrill(
            f"no checkpoint for step {selector.step} under {discovery.root} (retained steps: {steps})",
            hint=f"drill a retained one: drill run --root {discovery.root} --checkpoint step:{found[-1].step}",
        )
    assert selector.path is not None
    candidates = [selector.path, os.path.join(discovery.root, selector.path)]
    for ref in found:
        if any(_same_path(ref.uri, c) for c in candidates):
            return ref
    for inc in discovery.incomplete:
        if any(_same_path(inc.uri, c) for c in candidates):
            raise NothingToDrill(f"{inc.uri} is an incomplete save ({inc.reason})")
    raise NothingToDrill(f"{selector.path} is not a checkpoint under {discovery.root}")
