"""Restore a PyTorch Distributed Checkpoint (DCP) directory through drill's own reader.

``torch.distributed.checkpoint.FileSystemReader`` unpickles ``.metadata`` with plain
``pickle`` and deserializes non-tensor entries with ``weights_only=False``: loading an
untrusted checkpoint through it runs whatever code the checkpoint names. :class:`DrillReader`
reads through a :class:`~drill.storage.Storage`, unpickles metadata through an allow-list,
loads every entry with ``weights_only=True``, reads each file exactly once, and records every
file and entry it could not restore instead of stopping at the first.
"""

from __future__ import annotations

import io
from collections import deque
import os
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future as CFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import StorageReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from drill.discover import DCP_METADATA, CheckpointRef
from drill.integrity.hashing import FileHashes
from drill.restore.progress import NullProgress, Progress
from drill.restore.stream import ViewReader, describe_read_error, read_whole
from drill.restore.result import FileRead, HashPlan, ItemFailure, RestoreResult, TensorInfo
from drill.safe_pickle import restricted_loads
from drill.storage import Storage

class MetadataUnreadable(Exception):
    pass


class SafeLoadPlanner(DefaultLoadPlanner):
    """The default planner, but non-tensor entries load with ``weights_only=True`` and a value
    that will not deserialize becomes a recorded failure instead of an exception."""

    def __init__(self, failures: list[ItemFailure], *, flatten: bool = False) -> None:
        # flatten=True for loading into nested Stateful objects (a replay's training objects),
        # False for drill's own flat targets.
        super().__init__(flatten_state_dict=flatten, flatten_sharded_tensors=flatten)
        self._failures = failures
        self.values_loaded = 0

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj
            self.values_loaded += 1
        except Exception as exc:  # noqa: BLE001 - any failure is evidence, not a crash
            unsafe = "Weights only load failed" in str(exc)
            self._failures.append(
                ItemFailure(
                    fqn,
                    None,
                    "refused to unpickle: it names code outside the allow-list; nothing was executed"
                    if unsafe
                    else f"value does not deserialize safely: {_one_line(exc)}",
                    code="unsafe-pickle" if unsafe else "entry-not-loaded",
                )
            )


@dataclass(slots=True)
class _Loaded:
    relative_path: str
    view: memoryview | None
    error: BaseException | None


class DrillReader(StorageReader):
    """A DCP ``StorageReader`` over a :class:`Storage` that records instead of raising."""

    def __init__(
        self, storage: Storage, uri: str, result: RestoreResult, progress: Progress, plan: HashPlan, workers: int = 4
    ) -> None:
        super().__init__()
        self.plan = plan
        self.storage = storage
        self.uri = uri
        self.result = result
        self.progress = progress
        self.workers = workers
        self.storage_data: dict[Any, Any] = {}
        self._metadata: Metadata | None = None
        self._records: dict[str, FileRead] = {}
        self._lock = threading.Lock()

    # -- StorageReader protocol -------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            self.uri = str(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return True

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = self._read_metadata()
        return self._metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data or {}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for loaded in self._read_files(sorted(per_file)):
            started = time.perf_counter()
            self._load_items(loaded, per_file[loaded.relative_path], planner)
            self.result.load_seconds += time.perf_counter() - started
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    # -- reading ----------------------------------------------------------------------------
    def _read_metadata(self) -> Metadata:
        started = time.perf_counter()
        record = FileRead(DCP_METADATA, None)
        self.result.files.append(record)
        try:
            uri = self.storage.child(self.uri, DCP_METADATA)
            record.size = self.storage.stat(uri).size
            view, record.hashes = self._read(uri, DCP_METADATA, record.size)
            data = view.tobytes()
            record.bytes_read = len(data)
        except OSError as exc:
            record.error, record.error_kind = describe_read_error(exc)
            raise MetadataUnreadable(f"{DCP_METADATA}: {record.error}") from exc
        finally:
            self.result.read_seconds += time.perf_counter() - started
        try:
            metadata = restricted_loads(data)
        except Exception as exc:  # noqa: BLE001
            raise MetadataUnreadable(f"{DCP_METADATA} does not unpickle safely: {_one_line(exc)}") from exc
        if not isinstance(metadata, Metadata):
            raise MetadataUnreadable(f"{DCP_METADATA} holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def _read(self, uri: str, relative_path: str, size: int) -> tuple[memoryview, FileHashes | None]:
        return read_whole(
            self.storage,
            uri,
            size,
            self.progress.advance,
            hash=self.plan.wants(relative_path),
            chunk_size=self.plan.chunk_size,
            sha256=relative_path in self.plan.sha256,
        )

    def _read_one(self, relative_path: str, record: FileRead) -> _Loaded:
        try:
            uri = self.storage.child(self.uri, relative_path)
            record.size = self.storage.stat(uri).size
            view, record.hashes = self._read(uri, relative_path, record.size)
            record.bytes_read = len(view)
            return _Loaded(relative_path, view, None)
        except (OSError, EOFError) as exc:
            record.error, record.error_kind = describe_read_error(exc)
            return _Loaded(relative_path, None, exc)

    def _read_files(self, paths: list[str]) -> Iterator[_Loaded]:
        """Yield each file's bytes as it arrives, reading ahead on ``workers`` threads.

        At most ``workers + 1`` file buffers are alive at once, so peak memory stays near
        the restored state plus a few files, not twice the checkpoint.
        """
        records = {p: FileRead(p, None) for p in paths}
        self._records = records
        self.result.files.extend(records.values())
        window = self.workers + 1
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="drill-read") as pool:
            pending: deque[CFuture[_Loaded]] = deque()
            queue = deque(paths)
            while queue or pending:
                while queue and len(pending) < window:
                    p = queue.popleft()
                    pending.append(pool.submit(self._read_one, p, records[p]))
                waited = time.perf_counter()
                loaded = pending.popleft().result()
                self.result.read_seconds += time.perf_counter() - waited
                yield loaded

    # -- loading ----------------------------------------------------------------------------
    def _load_items(self, loaded: _Loaded, items: list[ReadItem], planner: LoadPlanner) -> None:
        record = self._records[loaded.relative_path]
        record.items = len(items)
        for item in items:
            fqn = item.dest_index.fqn
            if loaded.view is None:
                self.result.failures.append(ItemFailure(fqn, loaded.relative_path, f"file {record.error_kind}: {record.error}"))
                continue
            info = self.storage_data[item.storage_index]
            end = info.offset + info.length
            if end > len(loaded.view):
                self.result.failures.append(
                    ItemFailure(
                        fqn,
                        loaded.relative_path,
                        f"bytes {info.offset}..{end} lie past the end of the file ({len(loaded.view)} bytes)",
                    )
                )
                continue
            if getattr(info, "transform_descriptors", None):
                self.result.failures.append(
                    ItemFailure(fqn, loaded.relative_path, f"unsupported DCP stream transform {info.transform_descriptors}")
                )
                continue
            blob = ViewReader(loaded.view[info.offset : end])
            try:
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, blob)
                    continue
                tensor = torch.load(blob, map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
                target = planner.resolve_tensor(item).detach()
                if target.size() != tensor.size():
                    raise ValueError(f"shape {tuple(tensor.size())} where metadata says {tuple(target.size())}")
                target.copy_(tensor)
                planner.commit_tensor(item, target)
                self.result.tensors_loaded += 1
                self.result.tensor_bytes += tensor.numel() * tensor.element_size()
            except Exception as exc:  # noqa: BLE001 - a bad entry is evidence, not a crash
                self.result.failures.append(ItemFailure(fqn, loaded.relative_path, _one_line(exc)))


def skeleton(metadata: Metadata, device: torch.device) -> dict[str, Any]:
    """Targets for every entry in the checkpoint, allocated on ``device`` as a resume would."""
    state: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            state[fqn] = torch.empty(md.size, dtype=md.properties.dtype, device=device)
        elif isinstance(md, BytesStorageMetadata):
            state[fqn] = None
    return state


def restore_dcp(
    storage: Storage,
    ref: CheckpointRef,
    device: torch.device,
    progress: Progress | None = None,
    plan: HashPlan | None = None,
) -> RestoreResult:
    """Read every file of the DCP checkpoint ``ref`` once — hashing it as ``plan`` says — and
    load every entry onto ``device``."""
    progress = progress or NullProgress()
    result = RestoreResult(uri=ref.uri, format="dcp", device=str(device))
    reader = DrillReader(storage, ref.uri, result, progress, plan or HashPlan())
    try:
        metadata = reader.read_metadata()
    except MetadataUnreadable as exc:
        result.metadata_error = str(exc)
        return result
    result.index = metadata.storage_data
    result.inventory = [
        TensorInfo(
            fqn,
            tuple(md.size),
            str(md.properties.dtype).replace("torch.", ""),
            md.size.numel() * torch.empty((), dtype=md.properties.dtype).element_size(),
        )
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    ]  # from the index alone: nothing materialized
    progress.phase("read", total_bytes=_checkpoint_bytes(storage, ref.uri, metadata))
    state = skeleton(metadata, device)
    planner = SafeLoadPlanner(result.failures)
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        # A single-process restore is intended; DCP warns about it on every call.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    result.values_loaded = planner.values_loaded
    result.state = state
    return result


def _checkpoint_bytes(storage: Storage, uri: str, metadata: Metadata) -> int | None:
    total = 0
    for rel in {info.relative_path for info in (metadata.storage_data or {}).values()}:
        try:
            total += storage.stat(storage.child(uri, rel)).size
        except OSError:
            continue
    return total or None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_into(storage: Storage, uri: str, stateful: dict[str, Any]) -> None:
    """Load a DCP checkpoint into live training objects (``Stateful``s), the way a resume
    does, through drill's safe reader; raises on anything that does not load."""
    import torch.distributed.checkpoint as dcp

    result = RestoreResult(uri=uri, format="dcp", device="")
    reader = DrillReader(storage, uri, result, NullProgress(), HashPlan(files=frozenset()))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(stateful, storage_reader=reader, planner=SafeLoadPlanner(result.failures, flatten=True), no_dist=True)
    problems = result.failures + [ItemFailure(f.relative_path, f.relative_path, f.error or "") for f in result.files if f.error]
    if result.metadata_error or problems:
        raise RuntimeError(f"checkpoint did not load into the training objects: {result.metadata_error or problems[0].reason}")
