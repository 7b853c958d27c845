"""The ``dcp`` adapter: PyTorch Distributed Checkpoint directories, through drill's own reader.

``torch.distributed.checkpoint.FileSystemReader`` unpickles ``.metadata`` with plain
``pickle`` and deserializes non-tensor entries with ``weights_only=False``: loading an
untrusted checkpoint through it runs whatever code the checkpoint names. :class:`DrillReader`
reads through a :class:`~drill.storage.Storage`, unpickles metadata through an allow-list,
loads every entry with ``weights_only=True``, reads each file exactly once, and records every
file and entry it could not restore instead of stopping at the first.
"""

from __future__ import annotations

import io
import os
import time
import warnings
from collections import deque
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

from drill import parts
from drill.discover import DCP_METADATA, CheckpointRef
from drill.formats.base import RestoreContext, one_line
from drill.formats.canonical import Layout
from drill.formats.safeload import load_failure
from drill.integrity.reading import describe_read_error, read_whole
from drill.restore import FileRead, ItemFailure, RestoreResult, TensorInfo
from drill.safe_pickle import restricted_loads
from drill.storage import Storage
from drill.views import ViewReader


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
        except Exception as exc:  # noqa: BLE001 - any failure is evidence, not a crash
            code, reason = load_failure(exc)
            self._failures.append(ItemFailure(fqn, None, reason, code=code))
            return
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
        self.values_loaded += 1


@dataclass(slots=True)
class _Loaded:
    relative_path: str
    view: memoryview | None


class DrillReader(StorageReader):
    """A DCP ``StorageReader`` over a :class:`Storage` that records instead of raising."""

    def __init__(self, storage: Storage, uri: str, result: RestoreResult, ctx: RestoreContext, workers: int = 4) -> None:
        super().__init__()
        self.storage = storage
        self.uri = uri
        self.result = result
        self.ctx = ctx
        self.workers = workers
        self.storage_data: dict[Any, Any] = {}
        self._metadata: Metadata | None = None
        self._records: dict[str, FileRead] = {}

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
        view = self._read_one(DCP_METADATA, record).view
        self.result.read_seconds += time.perf_counter() - started
        if view is None:
            raise MetadataUnreadable(f"{DCP_METADATA}: {record.error}")
        try:
            metadata = restricted_loads(bytes(view))
        except Exception as exc:  # noqa: BLE001
            raise MetadataUnreadable(f"{DCP_METADATA} does not unpickle safely: {one_line(exc)}") from exc
        if not isinstance(metadata, Metadata):
            raise MetadataUnreadable(f"{DCP_METADATA} holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def _read_one(self, relative_path: str, record: FileRead) -> _Loaded:
        plan = self.ctx.hash_plan
        try:
            uri = self.storage.child(self.uri, relative_path)
            record.size = self.storage.stat(uri).size
            got = read_whole(
                self.storage,
                uri,
                record.size,
                self.ctx.progress.advance,
                hash=plan.wants(relative_path),
                chunk_size=plan.chunk_size,
                sha256=relative_path in plan.sha256,
            )
        except (OSError, EOFError) as exc:
            record.error, record.error_kind = describe_read_error(exc)
            return _Loaded(relative_path, None)
        record.hashes, record.retries, record.bytes_read = got.hashes, got.retries, len(got.view)
        return _Loaded(relative_path, got.view)

    def _read_files(self, paths: list[str]) -> Iterator[_Loaded]:
        """Yield each file's bytes as it arrives, reading ahead on ``workers`` threads.

        At most ``workers + 1`` file buffers are alive at once, so peak memory stays near
        the restored state plus a few files, not twice the checkpoint.
        """
        records = {p: FileRead(p, None) for p in paths}
        self._records = records
        self.result.files.extend(records.values())
        window = self.workers + 1
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="drill-read")
        pending: deque[CFuture[_Loaded]] = deque()
        queue = deque(paths)
        try:
            while queue or pending:
                while queue and len(pending) < window:
                    p = queue.popleft()
                    pending.append(pool.submit(self._read_one, p, records[p]))
                waited = time.perf_counter()
                loaded = pending.popleft().result()
                self.result.read_seconds += time.perf_counter() - waited
                yield loaded
        finally:
            # An interrupt must not wait for reads in flight (a stuck mount could hold it
            # forever): queued reads are cancelled and the threads left to finish alone.
            pool.shutdown(wait=not (queue or pending), cancel_futures=True)

    # -- loading ----------------------------------------------------------------------------
    def _load_items(self, loaded: _Loaded, items: list[ReadItem], planner: LoadPlanner) -> None:
        record = self._records[loaded.relative_path]
        record.items = len(items)
        for item in items:
            fqn = item.dest_index.fqn
            if loaded.view is None:
                self.result.failures.append(ItemFailure(fqn, loaded.relative_path, f"file {record.error_kind}: {record.error}"))
                continue
            problem = self._load_item(loaded.view, item, planner)
            if problem is not None:
                self.result.failures.append(ItemFailure(fqn, loaded.relative_path, problem[1], code=problem[0]))

    def _load_item(self, view: memoryview, item: ReadItem, planner: LoadPlanner) -> tuple[str, str] | None:
        """Load one entry from its file's bytes; (code, reason) when it does not load."""
        info = self.storage_data[item.storage_index]
        end = info.offset + info.length
        if end > len(view):
            return "entry-not-loaded", f"bytes {info.offset}..{end} lie past the end of the file ({len(view)} bytes)"
        if getattr(info, "transform_descriptors", None):
            return "entry-not-loaded", f"unsupported DCP stream transform {info.transform_descriptors}"
        blob = ViewReader(view[info.offset : end])
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, blob)
            return None
        try:
            tensor = torch.load(blob, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a bad entry is evidence, not a crash
            return load_failure(exc)
        try:
            tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            if target.size() != tensor.size():
                raise ValueError(f"shape {tuple(tensor.size())} where metadata says {tuple(target.size())}")
            target.copy_(tensor)
            planner.commit_tensor(item, target)
        except Exception as exc:  # noqa: BLE001
            return "entry-not-loaded", one_line(exc)
        self.result.tensors_loaded += 1
        self.result.tensor_bytes += tensor.numel() * tensor.element_size()
        return None


def skeleton(metadata: Metadata, device: torch.device) -> dict[str, Any]:
    """Targets for every entry in the checkpoint, allocated on ``device`` as a resume would."""
    state: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            state[fqn] = torch.empty(md.size, dtype=md.properties.dtype, device=device)
        elif isinstance(md, BytesStorageMetadata):
            state[fqn] = None
    return state


def inventory(metadata: Metadata) -> list[TensorInfo]:
    """Every tensor from the index alone: nothing materialized."""
    return [
        TensorInfo(
            fqn,
            tuple(md.size),
            str(md.properties.dtype).replace("torch.", ""),
            md.size.numel() * torch.empty((), dtype=md.properties.dtype).element_size(),
        )
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    ]


class DCPAdapter:
    name = "dcp"

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """Read every file of ``ref`` once — hashed as the plan says — and load every entry
        onto the device into targets allocated from the metadata, as a resume would."""
        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        result.layout = Layout(format=self.name, required=parts.CANONICAL_PARTS, optimizer_keys="fqn")
        if ref.step is not None:
            result.layout.step_counters["directory name"] = ref.step
        reader = DrillReader(storage, ref.uri, result, ctx)
        try:
            metadata = reader.read_metadata()
        except MetadataUnreadable as exc:
            result.metadata_error = str(exc)
            return result
        result.index = metadata.storage_data
        result.inventory = inventory(metadata)
        ctx.progress.phase("read", total_bytes=_checkpoint_bytes(storage, ref.uri, metadata))
        state = skeleton(metadata, ctx.device)
        planner = SafeLoadPlanner(result.failures)
        _dcp_load(state, reader, planner)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        result.values_loaded = planner.values_loaded
        result.state = state
        return result


def _dcp_load(state: dict[str, Any], reader: DrillReader, planner: SafeLoadPlanner) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        # A single-process restore is intended; DCP warns about it on every call.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)


def _checkpoint_bytes(storage: Storage, uri: str, metadata: Metadata) -> int | None:
    total = 0
    for rel in {info.relative_path for info in (metadata.storage_data or {}).values()}:
        try:
            total += storage.stat(storage.child(uri, rel)).size
        except OSError:
            continue
    return total or None


def load_into(storage: Storage, uri: str, stateful: dict[str, Any]) -> None:
    """Load a DCP checkpoint into live training objects (``Stateful``s), the way a resume
    does, through drill's safe reader; raises on anything that does not load."""
    from drill.restore import NullProgress
    from drill.integrity.hashing import HashPlan

    result = RestoreResult(uri=uri, format="dcp", device="")
    ctx = RestoreContext(device=torch.device("cpu"), progress=NullProgress(), hash_plan=HashPlan(files=frozenset()))
    reader = DrillReader(storage, uri, result, ctx)
    _dcp_load(stateful, reader, SafeLoadPlanner(result.failures, flatten=True))
    problems = [f.reason for f in result.failures] + [f"{f.relative_path}: {f.error}" for f in result.files if f.error]
    if result.metadata_error or problems:
        raise RuntimeError(f"checkpoint did not load into the training objects: {result.metadata_error or problems[0]}")
