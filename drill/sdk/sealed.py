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
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, FileHashes
from drill.integrity.sealing import SaveBusy, SealingWriter, SealReport, sealing, write_manifest

DATABASE_ENV = "DRILL_DATABASE_URL"


def _prepare(
    fn: Any, checkpoint_id: str | os.PathLike, key: bytes | None, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any], str | None]:
    """(the sealing writer, what DCP's ``fn`` takes of ``kwargs``, the database to record in).
    Given ``storage_writer`` (s3torchconnector's ``S3StorageWriter``…), that writer sealing as it
    writes; else a SealingWriter taking the keyword arguments DCP does not."""
    db, inner = kwargs.pop("db", None), kwargs.pop("storage_writer", None)
    dcp_kwargs, writer_options = _split(fn, kwargs)
    writer = sealing(inner, key=key) if inner is not None else SealingWriter(checkpoint_id, key=key, **writer_options)
    return writer, dcp_kwargs, db


def _split(fn: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what DCP's ``fn`` takes, what goes to ``FileSystemWriter``)."""
    import inspect

    names = set(inspect.signature(fn).parameters)
    return {k: v for k, v in kwargs.items() if k in names}, {k: v for k, v in kwargs.items() if k not in names}


def save(
    state_dict: dict[str, Any],
    checkpoint_id: str | os.PathLike,
    *,
    key: bytes | None = None,
    process_group: Any = None,
    planner: Any = None,
    **kwargs: Any,
) -> SealReport:
    """``dcp.save`` sealed at write time. Returns what the seal cost (on the coordinator; other
    ranks get an empty report). Keyword arguments ``dcp.save`` knows (``no_dist``, …) go to it;
    the rest to ``FileSystemWriter`` (``thread_count``, ``sync_files``, …). ``storage_writer``:
    another file-system writer to seal through — s3torchconnector's ``S3StorageWriter`` writes
    straight to S3."""
    import torch.distributed.checkpoint as dcp

    writer, dcp_kwargs, db = _prepare(dcp.save, checkpoint_id, key, kwargs)
    with _busy_said():
        dcp.save(
            state_dict,
            checkpoint_id=checkpoint_id,
            storage_writer=writer,
            planner=planner,
            process_group=process_group,
            **dcp_kwargs,
        )
    writer.report.record = record_save(writer.report, checkpoint_id, "writer", db)
    return writer.report


@contextmanager
def _busy_said() -> Iterator[None]:
    """DCP wraps what a rank's step raised in a ``CheckpointException``: a save refused
    because another holds the step is said as itself (:class:`SaveBusy`), on every rank."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        failures = [f[0] if isinstance(f, tuple) else f for f in getattr(exc, "failures", {}).values()]
        busy = [e for e in failures if isinstance(e, SaveBusy)]
        if busy:
            raise SaveBusy(str(busy[0])) from None
        raise


def async_save(
    state_dict: dict[str, Any],
    checkpoint_id: str | os.PathLike,
    *,
    key: bytes | None = None,
    process_group: Any = None,
    planner: Any = None,
    **kwargs: Any,
) -> Any:
    """``dcp.async_save`` sealed at write time: the state is staged as DCP stages it, then
    written and hashed in the background; returns DCP's future (wait on it before the next save).
    Keyword arguments DCP's ``async_save`` knows (``async_checkpointer_type``,
    ``async_stager``, ``no_dist``, …) go to it; the rest to ``FileSystemWriter``."""
    import torch.distributed.checkpoint as dcp

    writer, dcp_kwargs, db = _prepare(dcp.async_save, checkpoint_id, key, kwargs)
    pending = dcp.async_save(
        state_dict,
        checkpoint_id=checkpoint_id,
        storage_writer=writer,
        planner=planner,
        process_group=process_group,
        **dcp_kwargs,
    )
    done: Any = getattr(pending, "upload_completion", pending)  # a Future (torch < 2.7 returns one)

    def recorded(future: Any) -> None:
        if future.exception() is None:
            writer.report.record = record_save(writer.report, checkpoint_id, "writer", db)

    done.add_done_callback(recorded)
    return pending


def seal_across_ranks(
    path: str | os.PathLike,
    *,
    key: bytes | None = None,
    process_group: Any = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> SealReport:
    """Seal a checkpoint a writer drill cannot wrap (transformers' Trainer saves through
    ``torch.save``), right after it was saved: every rank of the job hashes its share of the
    files — balanced by bytes — in parallel, and rank 0 writes the manifest; a second read of
    each byte, split over the ranks. Called on every rank (a collective when a process group
    exists); returns the cost, ``bytes_read_back`` included."""
    import torch.distributed as dist

    from drill.integrity.manifest import MANIFEST_NAME, list_files
    from drill.integrity.parallel import hash_files
    from drill.restore.partition import assign
    from drill.storage import storage_for

    started = time.perf_counter()
    checkpoint = os.fspath(path)
    storage = storage_for(checkpoint)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(process_group), dist.get_world_size(process_group)) if distributed else (0, 1)
    if distributed:
        dist.barrier(group=process_group)  # every rank's files are on storage
    box: list[Any] = [None]
    if rank == 0:
        box = [{rel: size for rel, size in list_files(storage, checkpoint).files.items() if rel != MANIFEST_NAME}]
    if distributed:
        dist.broadcast_object_list(
            box, src=dist.get_global_rank(process_group, 0) if process_group is not None else 0, group=process_group
        )
    sizes: dict[str, int] = box[0]
    share = assign(sizes, world)[rank] if world > 1 else sorted(sizes)
    t = time.perf_counter()
    mine = hash_files(storage, checkpoint, {rel: sizes[rel] for rel in share}, chunk_size)
    hashed = (mine, time.perf_counter() - t)
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    if distributed:
        dist.gather_object(
            hashed,
            gathered,
            dst=dist.get_global_rank(process_group, 0) if process_group is not None else 0,
            group=process_group,
        )
    else:
        gathered = [hashed]
    report = SealReport()
    if rank == 0:
        assert gathered is not None
        _write_gathered(report, gathered, checkpoint, key, chunk_size)
    if distributed:
        dist.barrier(group=process_group)  # nobody moves on (rotates, resumes) before the seal exists
    report.save_seconds = time.perf_counter() - started
    return report


def _write_gathered(
    report: SealReport, gathered: list[Any], checkpoint: str, key: bytes | None, chunk_size: int
) -> None:
    """On rank 0: the manifest of every rank's digests (``(path → FileHashes or the OSError that
    stopped the read, seconds)`` each), written into the checkpoint; a file no rank could read
    seals nothing."""
    files: dict[str, FileHashes] = {}
    for part, seconds in gathered:
        report.hash_seconds += seconds
        for rel, h in part.items():
            if isinstance(h, OSError):
                raise OSError(h.errno, f"cannot seal {checkpoint}: {rel}: {h.strerror or h}")
            files[rel] = h
    report.manifest = write_manifest(Path(checkpoint), files, key, chunk_size)
    report.files, report.bytes, report.keyed = len(files), sum(h.size for h in files.values()), key is not None
    report.bytes_read_back = report.bytes


def record_save(report: SealReport, checkpoint_id: str | os.PathLike, method: str, db: str | None) -> Path | None:
    """Record the save (on the coordinator, when a database is named: ``db``, else
    ``$DRILL_DATABASE_URL``) as a resume is recorded: a spooled file, a few milliseconds on the
    trainer's host with no database layer imported, delivered by the next drill, the
    scheduler's heartbeat, ``drill db flush`` or :func:`drill.sdk.flush_records`. Never raises
    into the trainer. Returns the spooled file (None: nothing recorded)."""
    url = db or os.environ.get(DATABASE_ENV)
    if not url or report.manifest is None:
        return None
    from drill.records.spool import spool_record

    return spool_record(_document(report, os.fspath(checkpoint_id), method), url)


def _document(report: SealReport, checkpoint: str, method: str) -> dict[str, Any]:
    from drill import __version__
    from drill.checkpoints import step_of
    from drill.records.spool import SAVE_KIND as KIND
    from drill.records.spool import SAVE_VERSION
    from drill.storage import normalize

    uri = normalize(checkpoint)
    return {
        "kind": KIND, "version": SAVE_VERSION, "checkpoint": uri, "run_root": normalize(os.path.dirname(uri.rstrip("/"))), "step": step_of(os.path.basename(uri.rstrip("/"))),
        "method": method, "files": report.files, "bytes": report.bytes, "hash_seconds": round(report.hash_seconds, 6),
        "save_seconds": round(report.save_seconds, 6), "bytes_read_back": report.bytes_read_back, "keyed": report.keyed,
        "host": socket.gethostname(), "pid": os.getpid(), "saved_at": datetime.now(timezone.utc).isoformat(), "drill_version": __version__,
    }  # fmt: skip


__all__ = [
    "SaveBusy",
    "SealReport",
    "SealingWriter",
    "async_save",
    "record_save",
    "save",
    "seal_across_ranks",
    "sealing",
]
