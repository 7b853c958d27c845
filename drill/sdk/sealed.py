"""``drill.sdk.save`` and ``drill.sdk.async_save``: DCP's saves, sealed as they write.

They take what ``dcp.save`` and ``dcp.async_save`` take — the same state, process group,
planner and (for ``async_save``) staging — and write through
:class:`~drill.integrity.sealing.SealingWriter`: every rank hashes the bytes it writes, the
coordinator writes ``drill-manifest.json`` just before it commits ``.metadata``. No second
read, and no second pass on the training thread: ``async_save`` hashes in DCP's background
persist thread.

    from drill.sdk import load_key, save
    report = save(state, checkpoint_id=f"{run}/step-{step}", key=load_key())
"""

from __future__ import annotations

import os
from typing import Any

from drill.integrity.sealing import SealingWriter, SealReport


def _writer(checkpoint_id: str | os.PathLike, key: bytes | None, writer_options: dict[str, Any]) -> SealingWriter:
    return SealingWriter(checkpoint_id, key=key, **writer_options)


def _split(fn: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what DCP's ``fn`` takes, what goes to ``FileSystemWriter``)."""
    import inspect

    names = set(inspect.signature(fn).parameters)
    return {k: v for k, v in kwargs.items() if k in names}, {k: v for k, v in kwargs.items() if k not in names}


def save(
    state_dict: dict[str, Any], checkpoint_id: str | os.PathLike, *, key: bytes | None = None, process_group: Any = None, planner: Any = None, **kwargs: Any
) -> SealReport:
    """``dcp.save`` sealed at write time. Returns what the seal cost (on the coordinator; other
    ranks get an empty report). Keyword arguments ``dcp.save`` knows (``no_dist``, …) go to it;
    the rest to ``FileSystemWriter`` (``thread_count``, ``sync_files``, …)."""
    import torch.distributed.checkpoint as dcp

    dcp_kwargs, writer_options = _split(dcp.save, kwargs)
    writer = _writer(checkpoint_id, key, writer_options)
    dcp.save(state_dict, checkpoint_id=checkpoint_id, storage_writer=writer, planner=planner, process_group=process_group, **dcp_kwargs)
    return writer.report


def async_save(
    state_dict: dict[str, Any], checkpoint_id: str | os.PathLike, *, key: bytes | None = None, process_group: Any = None, planner: Any = None, **kwargs: Any
) -> Any:
    """``dcp.async_save`` sealed at write time: the state is staged as DCP stages it, then
    written and hashed in the background; returns DCP's future (wait on it before the next save).
    Keyword arguments DCP's ``async_save`` knows (``async_checkpointer_type``,
    ``async_stager``, ``no_dist``, …) go to it; the rest to ``FileSystemWriter``."""
    import torch.distributed.checkpoint as dcp

    dcp_kwargs, writer_options = _split(dcp.async_save, kwargs)
    writer = _writer(checkpoint_id, key, writer_options)
    return dcp.async_save(state_dict, checkpoint_id=checkpoint_id, storage_writer=writer, planner=planner, process_group=process_group, **dcp_kwargs)


__all__ = ["SealReport", "SealingWriter", "async_save", "save"]
