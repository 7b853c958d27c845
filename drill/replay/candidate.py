"""A candidate environment: another interpreter — a newer torch, transformers, megatron-core, or
the team's next trainer commit — that the replay runs under instead of drill's own.

drill probes it before the drill begins (it must import drill; nothing is recorded when it
cannot), records the versions of what matters to a resume in each environment, and says what
changed between them. The replay child then runs there, isolated (``-I``) with the
candidate's own import path, less anything inside the run directory or the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from drill.errors import UsageError

PACKAGES = (
    "drill", "torch", "numpy", "transformers", "accelerate", "lightning", "pytorch-lightning",
    "megatron-core", "deepspeed", "torchtitan", "safetensors",
)  # fmt: skip
"""Distributions whose versions decide whether a checkpoint restores and resumes the same."""

PROBE = (
    "import json, sys, importlib.metadata as m\n"
    "import drill, drill.replay.child\n"
    "found = {}\n"
    "for name in json.loads(sys.argv[1]):\n"
    "    try:\n"
    "        found[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps({'python': sys.version.split()[0], 'packages': found}))\n"
)


def environment(python: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """What the environment of ``python`` (None: this one) holds: its interpreter's path and
    version, and the versions of :data:`PACKAGES` installed there. :class:`UsageError` when
    ``python`` cannot run, or cannot import drill."""
    if python is None:
        return _this()
    return _probe(python, timeout)


def _this() -> dict[str, Any]:
    import importlib.metadata as m

    found = {}
    for name in PACKAGES:
        try:
            found[name] = m.version(name)
        except m.PackageNotFoundError:
            pass
    return {"python": sys.version.split()[0], "executable": sys.executable, "packages": found}


def _probe(python: str, timeout: float) -> dict[str, Any]:
    where = f"--python {python}"
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise UsageError(
            f"{where}: not an executable file",
            hint="name the candidate environment's interpreter, e.g. /opt/next/bin/python",
        )
    try:
        res = subprocess.run(
            [python, "-I", "-c", PROBE, json.dumps(PACKAGES)],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd="/",
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UsageError(f"{where}: did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot run it ({exc.strerror or exc})") from None
    try:
        found = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, dict) or not isinstance(found.get("packages"), dict):
        last = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1][:200]
        raise UsageError(
            f"{where}: the candidate environment cannot import drill ({last})",
            hint="install drill (and the trainer) into the candidate environment: its replay runs drill's child there (nothing was recorded)",
        )
    return {
        "python": str(found.get("python")),
        "executable": python,
        "packages": {str(k): str(v) for k, v in found["packages"].items()},
    }


def changes(current: dict[str, Any], candidate: dict[str, Any]) -> dict[str, list[str | None]]:
    """Each package (and the interpreter) whose version differs: name → [current, candidate]."""
    before, after = (
        {"python": current["python"], **current["packages"]},
        {"python": candidate["python"], **candidate["packages"]},
    )
    return {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)}


__all__ = ["PACKAGES", "changes", "environment"]
