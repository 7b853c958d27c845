"""Checkpoints of writers drill was never taught: a save directory of ``torch.save``, safetensors
and JSON files that no other format claims.

Asked last. A directory whose name carries a step (:func:`~drill.checkpoints.step_of`:
``step-8``, ``ckpt_000008``, ``ep1-ba8``, ``epoch=1-step=8.ckpt``) and that holds at least
one non-empty state file (``.pt``, ``.pth``, ``.bin``, ``.ckpt``, ``.tar``, ``.safetensors``)
is one checkpoint; one that also holds a writer's temporary file (``*.tmp``, ``*.partial``, …)
is an unfinished save. Nothing says which files the writer meant to write, so what is proven
is what the bytes and the values say (docs/formats.md, "Writers drill was not taught"):

- every file's structure (a ``torch.save`` archive's central directory and CRC-32s, a
  safetensors header against its bytes, JSON that parses) and, once sealed, its hash;
- every file loaded without running code from it;
- the state view (:mod:`drill.formats.state_view`) of all of them together: the model,
  optimizer, scheduler, RNG, data-loader state and step counters wherever they are nested, and
  every check of them a known format gets (optimizer slots per parameter, step counters
  against the name, finite values).
"""

from __future__ import annotations

from typing import Any

from drill.checkpoints import CheckpointRef, IncompleteSave, step_of
from drill.formats.base import Format, RestoreContext, Structure
from drill.formats.bundle import JSON, SAFETENSORS, TORCH, Member
from drill.restore import RestoreResult
from drill.storage import Listing, Storage

STATE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors")
TEMP_SUFFIXES = (".tmp", ".temp", ".partial", ".part", ".incomplete", ".inprogress")
"""How writers name a file they have not finished (renamed into place when done)."""
FOREIGN_SUFFIXES = (".distcp",)
"""Files of a format drill knows: a directory holding them is that format's (or its unfinished save)."""


class UnknownWriter(Format):
    """A step directory of state files from a writer no other format claims (see the module's docstring)."""

    name = "unknown"
    fallback = True
    label = "unknown writer (.pt/.safetensors/.json files, its state found by shape)"

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        step = step_of(name)
        if step is None or entries.suffixed(*FOREIGN_SUFFIXES):
            return None
        state = [e for e in entries.suffixed(*STATE_SUFFIXES) if e.is_file and e.size > 0]
        if not state:
            return None
        temp = sorted(e.name for e in entries.suffixed(*TEMP_SUFFIXES))
        if temp:
            return IncompleteSave(
                uri,
                name,
                step,
                f"{temp[0]} is a file its writer had not finished (renamed when done): the save never finished",
            )
        return CheckpointRef(uri=uri, name=name, step=step, format=self.name, mtime=max(e.mtime for e in state))

    def every_save(self, name: str) -> bool:
        """Every state and JSON file: nothing else says which files the writer writes, so what
        its other saves hold is what it writes."""
        return name.endswith((*STATE_SUFFIXES, ".json"))

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.formats import bundle

        return bundle.structure(storage, uri, sizes, members(sizes))

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        from drill.formats import state_view
        from drill.formats.bundle import restore_members

        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        sizes = {e.name: e.size for e in storage.list(ref.uri) if e.is_file}

        def canonical(loaded: dict[str, Any]) -> dict[str, Any]:
            try:
                state, result.layout = state_view.view(_by_stem(loaded), format=self.name)
            except state_view.Unbounded as exc:
                result.metadata_error = f"{ref.name} was not read: {exc}"
                return {}
            if ref.step is not None:
                result.layout.step_counters["directory name"] = ref.step
            return state

        restore_members(storage, ref.uri, members(sizes), ctx, result, canonical)
        return result


def members(sizes: dict[str, int]) -> list[Member]:
    """The files at the checkpoint's top, each loaded as its name says (its bytes are proven whatever it says)."""
    out = []
    for path, size in sorted(sizes.items()):
        if "/" in path:
            continue
        if path.endswith(".safetensors"):
            out.append(Member(path, SAFETENSORS, size))
        elif path.endswith(".json"):
            out.append(Member(path, JSON, size))
        elif path.endswith(STATE_SUFFIXES):
            out.append(Member(path, TORCH, size))
    return out


def _by_stem(loaded: dict[str, Any]) -> dict[str, Any]:
    """What each file held, under its name without the suffix (unless two files share one)."""
    stems = [p.rsplit(".", 1)[0] for p in loaded]
    return {
        stem if stems.count(stem) == 1 else path: obj for stem, (path, obj) in zip(stems, loaded.items(), strict=True)
    }


__all__ = ["UnknownWriter", "members"]
