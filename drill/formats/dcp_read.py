"""The ``dcp`` adapter: PyTorch Distributed Checkpoint directories, through drill's own reader.

``torch.distributed.checkpoint.FileSystemReader`` unpickles ``.metadata`` with plain
``pickle`` and deserializes non-tensor entries with ``weights_only=False``: loading an
untrusted checkpoint through it runs whatever code the checkpoint names. :class:`DrillReader`
reads through a :class:`~drill.storage.Storage`, unpickles metadata through an allow-list,
loads every entry with ``weights_only=True``, reads each file exactly once, and records every
file and entry it could not restore instead of stopping at the first.

A drill's own restore does not go through ``dcp.load`` (nor import DCP at all: see
:mod:`drill.formats.dcp_types`): every chunk is read into its place in targets allocated
from the index. ``dcp.load`` with drill's reader — for live ``Stateful`` objects, resharding,
process groups — is :mod:`drill.formats.dcp_reader`.
"""

from __future__ import annotations

import io
import struct
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future as CFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, cast

import torch

from drill import parts
from drill.checkpoints import CheckpointRef
from drill.formats.base import RestoreContext, check_budget, one_line
from drill.formats.canonical import Layout
from drill.formats.dcp_entries import (
    DIRECT_MIN_BYTES,
    TAIL_BYTES,
    TensorSpec,
    data_start,
    local_header_end,
    records,
    tail_records,
    tensor_spec,
)
from drill.formats.dcp_index import claimed_bytes, file_sizes, inventory, saved_ranks, skeleton
from drill.formats.dcp_layout import apply_layout
from drill.formats.dcp_names import DCP_METADATA
from drill.formats.dcp_types import check_metadata, element_size, is_byte_io, load_metadata, narrow, read_items
from drill.formats.safeload import inert_values, load_failure
from drill.integrity.hashing import ChunkHasher, crc32
from drill.integrity.reading import (
    ATTEMPTS,
    LANE_MIN,
    TRANSIENT,
    Crc,
    CrcLane,
    SequentialReader,
    describe_read_error,
    read_whole,
)
from drill.memory import collector_paused
from drill.restore import FileRead, ItemFailure, RestoreResult
from drill.restore.staging import Stagers, byte_view
from drill.safe_pickle import bounded, with_classes
from drill.storage import Storage
from drill.views import ViewReader

READERS = 4
"""Reader threads where reads wait on storage or run outside the interpreter lock."""
LARGE_FILE = 4 << 20
"""A mean file size from which local files are read on :data:`READERS` threads."""


class MetadataUnreadable(Exception):
    pass


def load_value(value: io.BytesIO, fqn: str, failures: list[ItemFailure]) -> tuple[bool, Any]:
    """A pickled DCP value, loaded with ``weights_only=True`` admitting the plain values every
    load admits (:data:`~drill.formats.safeload.INERT_VALUES`: a timestamp's ``timedelta``, numpy
    RNG arrays); (False, None) and a recorded failure when it will not deserialize."""
    try:
        with torch.serialization.safe_globals(inert_values()):
            return True, bounded(torch.load(value, weights_only=True), value.getbuffer().nbytes)
    except Exception as exc:  # noqa: BLE001 - any failure is evidence, not a crash
        code, reason = load_failure(exc)
        failures.append(ItemFailure(fqn, None, reason, code=code))
        return False, None


class TargetPlanner:
    """Where each read item goes: tensor chunks into their place in the targets (read in
    place, so nothing to commit), values into the state dict."""

    stable_targets = True
    """``resolve_tensor`` gives the same target every time it is asked: it may be asked ahead."""

    def __init__(self, state: dict[str, Any], failures: list[ItemFailure]) -> None:
        self.state_dict = state
        self._failures = failures
        self.values_loaded = 0

    def resolve_tensor(self, read_item: Any) -> torch.Tensor:
        return narrow(self.state_dict[read_item.dest_index.fqn], read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
        pass

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        ok, obj = load_value(value, read_item.dest_index.fqn, self._failures)
        if ok:
            self.state_dict[read_item.dest_index.fqn] = obj
            self.values_loaded += 1


@dataclass(slots=True)
class _FileOutcome:
    """What one reader thread did with one file; the main thread applies it."""

    record: FileRead
    values: list[tuple[Any, memoryview]] = field(default_factory=list)
    """Non-tensor entries, deserialized by the main thread (they go into the state dict)."""
    failures: list[ItemFailure] = field(default_factory=list)
    tensors: int = 0
    tensor_bytes: int = 0
    stagers: Stagers = field(default_factory=Stagers)
    """Host buffers towards targets the reader cannot write itself (a GPU's)."""
    lane: CrcLane = field(default_factory=CrcLane)
    """Where large entries' CRC-32s are taken, beside the read."""
    populated: set[int] = field(default_factory=set)
    """Targets (by address) the lane was asked to fault in ahead of their entry."""
    unsettled: list[tuple[Any, Any, Any, bytes, int]] = field(default_factory=list)
    """Entries read in place whose CRC-32 the lane is still taking: (item, data record,
    data.pkl record, data.pkl's bytes, tensor bytes), settled in order when the file is read."""


class DrillReader:
    """DCP's index and data files over a :class:`Storage`, recording instead of raising.

    Each file is read once, in order, on a reader thread: a large tensor's bytes go straight
    from the file into the target tensor (see :mod:`drill.formats.dcp_entries`), everything
    else through a small buffer; every byte is hashed on the way.
    """

    def __init__(
        self, storage: Storage, uri: str, result: RestoreResult, ctx: RestoreContext, workers: int | None = None
    ) -> None:
        self.storage = storage
        self.uri = uri
        self.result = result
        self.ctx = ctx
        self.workers = workers
        self.storage_data: dict[Any, Any] = {}
        self._metadata: Any = None

    # -- the index and the data -------------------------------------------------------------
    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if self._metadata is None:
            self._metadata = self._read_metadata()
        return self._metadata

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data or {}

    def read_items(self, items: list[Any], planner: Any) -> None:
        """Read ``items`` (DCP ``ReadItem``s or drill's own) into ``planner``'s targets."""
        per_file: dict[str, list[Any]] = {}
        for item in items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        with collector_paused():
            for outcome in self._read_files(per_file, planner):
                started = time.perf_counter()
                self._apply(outcome, planner)
                self.result.load_seconds += time.perf_counter() - started

    # -- reading ----------------------------------------------------------------------------
    def _read_metadata(self) -> Any:
        started = time.perf_counter()
        record = FileRead(DCP_METADATA, None)
        self.result.files.append(record)
        try:
            uri = self.storage.child(self.uri, DCP_METADATA)
            record.size = self.storage.stat(uri).size
            got = read_whole(self.storage, uri, record.size, self.ctx.progress.advance, **self._hashing(DCP_METADATA))
            record.hashes, record.retries, record.bytes_read = got.hashes, got.retries, len(got.view)
        except (OSError, EOFError) as exc:
            record.error, record.error_kind = describe_read_error(exc)
            raise MetadataUnreadable(f"{DCP_METADATA}: {record.error}") from None
        finally:
            self.result.read_seconds += time.perf_counter() - started
        try:
            metadata = self.loads(bytes(got.view), with_classes(self.ctx.allow_classes))
        except Exception as exc:
            raise MetadataUnreadable(f"{DCP_METADATA} does not unpickle safely: {one_line(exc)}") from exc
        try:
            check_metadata(metadata)
        except ValueError as exc:
            raise MetadataUnreadable(f"{DCP_METADATA} is malformed: {exc}") from None
        return metadata

    @staticmethod
    def loads(data: bytes, allowed: frozenset[tuple[str, str]]) -> Any:
        """``.metadata`` into drill's mirrors of DCP's classes (DCP's own for ``dcp.load``)."""
        return load_metadata(data, allowed)

    def _hashing(self, relative_path: str) -> dict[str, Any]:
        plan = self.ctx.hash_plan
        return {
            "hash": plan.wants(relative_path),
            "chunk_size": plan.chunk_size,
            "sha256": relative_path in plan.sha256,
        }

    def _read_files(self, per_file: dict[str, list[Any]], planner: Any) -> Iterator[_FileOutcome]:
        """Each file's outcome as it is done, read on :meth:`_workers` threads."""
        paths = sorted(per_file)
        records = {p: FileRead(p, None, items=len(per_file[p])) for p in paths}
        self.result.files.extend(records.values())
        pool = ThreadPoolExecutor(max_workers=self.workers or self._workers(per_file), thread_name_prefix="drill-read")
        pending: deque[CFuture[_FileOutcome]] = deque(
            pool.submit(self._read_file, p, per_file[p], records[p], planner) for p in paths
        )
        done = False
        try:
            while pending:
                waited = time.perf_counter()
                outcome = pending.popleft().result()
                self.result.read_seconds += time.perf_counter() - waited
                yield outcome
            done = True
        finally:
            # An interrupt or the deadline must not wait for reads in flight (a hung mount could
            # hold them forever): queued reads are cancelled, running ones left to finish alone.
            pool.shutdown(wait=done, cancel_futures=True)

    def _workers(self, per_file: dict[str, list[Any]]) -> int:
        """Reader threads: four where a read waits on the network (object storage) or where
        files are large enough for their reads and hashes to run outside the interpreter lock;
        one for many small local files, which is interpreter work that more threads only
        contend for (20,000 files of 16 KiB: 2.1 s on one thread, 3.1 on four)."""
        if not getattr(self.storage, "positioned_reads", False) or not per_file:
            return READERS
        total = sum(int(self.storage_data[i.storage_index].length) for items in per_file.values() for i in items)
        return READERS if total / len(per_file) >= LARGE_FILE else 1

    def _read_file(self, relative_path: str, items: list[Any], record: FileRead, planner: Any) -> _FileOutcome:
        """One file, start to end; transient I/O errors are retried from the start."""
        for attempt in range(ATTEMPTS):
            outcome = _FileOutcome(record)
            try:
                self._stream_file(relative_path, sorted(items, key=self._offset), outcome, planner)
                return outcome
            except OSError as exc:
                if exc.errno in TRANSIENT and attempt + 1 < ATTEMPTS:
                    record.retries += 1
                    continue
                self._file_failed(exc, items, outcome)
                return outcome
            except EOFError as exc:
                self._file_failed(exc, items, outcome)
                return outcome
        raise AssertionError("unreachable")

    def _offset(self, item: Any) -> int:
        return int(self.storage_data[item.storage_index].offset)

    def _file_failed(self, exc: BaseException, items: list[Any], outcome: _FileOutcome) -> None:
        record = outcome.record
        record.error, record.error_kind = describe_read_error(exc)
        done = {f.key for f in outcome.failures}
        outcome.failures += [
            ItemFailure(i.dest_index.fqn, record.relative_path, f"file {record.error_kind}: {record.error}")
            for i in items
            if i.dest_index.fqn not in done
        ]

    def _stream_file(self, relative_path: str, items: list[Any], outcome: _FileOutcome, planner: Any) -> None:
        record = outcome.record
        f, record.size = self.storage.open_below(self.uri, relative_path)
        wanted = self._hashing(relative_path)
        hasher = ChunkHasher(wanted["chunk_size"], wanted["sha256"]) if wanted["hash"] else None
        with f:
            reader = SequentialReader(f, record.size, hasher, self.ctx.progress.advance)
            try:
                for i, item in enumerate(items):
                    if i + 1 < len(items):
                        _populate_ahead(items[i + 1], planner, outcome)
                    self._entry(reader, item, planner, outcome)
                _settle(outcome)
                record.hashes = reader.finish()  # the lane has hashed all it was handed before it closes
            finally:
                outcome.stagers.finish()  # the copies in flight land before the file counts as read
                outcome.lane.close()
            record.retries += getattr(f, "retries", 0)  # an object store's retried requests
        record.bytes_read = reader.pos

    # -- one entry --------------------------------------------------------------------------
    def _entry(self, reader: SequentialReader, item: Any, planner: Any, outcome: _FileOutcome) -> None:
        """One entry read and loaded; bytes that do not decode as the entry the index names —
        damaged, or another file's (shards swapped, an index copied from another run) — are
        that entry's finding, never an exception out of the restore."""
        try:
            self._one_entry(reader, item, planner, outcome)
        except _UNDECODABLE as exc:
            outcome.failures.append(
                ItemFailure(
                    item.dest_index.fqn,
                    outcome.record.relative_path,
                    f"its bytes do not decode as the entry the index names ({one_line(exc)}): damaged, or another file's",
                    code="entry-not-loaded",
                )
            )

    def _one_entry(self, reader: SequentialReader, item: Any, planner: Any, outcome: _FileOutcome) -> None:
        info = self.storage_data[item.storage_index]
        start, end = int(info.offset), int(info.offset) + int(info.length)
        fqn, path = item.dest_index.fqn, outcome.record.relative_path
        if end > reader.size:
            outcome.failures.append(
                ItemFailure(fqn, path, f"bytes {start}..{end} lie past the end of the file ({reader.size} bytes)")
            )
            return
        if start < reader.pos:
            outcome.failures.append(ItemFailure(fqn, path, f"bytes {start}..{end} overlap the entry before it"))
            return
        if getattr(info, "transform_descriptors", None):
            outcome.failures.append(
                ItemFailure(fqn, path, f"unsupported DCP stream transform {info.transform_descriptors}")
            )
            return
        reader.skip_to(start)
        # Every entry is held to the CRC-32s torch.save wrote into it — under a seal too: an
        # unkeyed manifest can be recomputed by whoever flipped the bit, the CRCs are a second,
        # independent witness, and a disagreement is a finding (taken beside the read: CrcLane).
        crc = True
        if is_byte_io(item):
            value = reader.read(end - start)
            if crc and (bad := _zip_problem(value)) is not None:
                outcome.failures.append(ItemFailure(fqn, path, bad[1], code=bad[0]))
                return
            outcome.values.append((item, value))
            return
        head: memoryview | bytes | None = b""
        if end - start >= DIRECT_MIN_BYTES:
            try:
                head = _read_in_place(reader, item, end - start, planner, outcome, crc)
            except CrcMismatch as exc:
                outcome.failures.append(ItemFailure(fqn, path, str(exc), code="crc-mismatch"))
                return
            if head is None:
                outcome.tensors += 1
                outcome.tensor_bytes += _nbytes(planner.resolve_tensor(item))
                return
        blob = bytes(head or b"") + bytes(reader.read(end - reader.pos))
        if end - start < DIRECT_MIN_BYTES:
            try:
                if _decode_in_place(memoryview(blob), item, planner):
                    outcome.tensors += 1
                    outcome.tensor_bytes += _nbytes(planner.resolve_tensor(item))
                    return
            except CrcMismatch as exc:
                outcome.failures.append(ItemFailure(fqn, path, str(exc), code="crc-mismatch"))
                return
        problem = _zip_problem(memoryview(blob)) if crc else None
        if problem is None:
            problem = _load_tensor(blob, item, planner)
        if problem is not None:
            outcome.failures.append(ItemFailure(fqn, path, problem[1], code=problem[0]))
            return
        outcome.tensors += 1
        outcome.tensor_bytes += _nbytes(planner.resolve_tensor(item))

    def _apply(self, outcome: _FileOutcome, planner: Any) -> None:
        """Non-tensor values into the state dict, and the file's tally into the result."""
        for item, blob in outcome.values:
            planner.load_bytes(item, io.BytesIO(blob))
        self.result.failures += outcome.failures
        self.result.tensors_loaded += outcome.tensors
        self.result.tensor_bytes += outcome.tensor_bytes


_UNDECODABLE = (struct.error, ValueError, IndexError, OverflowError, EOFError, KeyError, UnicodeDecodeError)
"""What parsing bytes that are not the entry they should be raises: damage, never a crash."""


class CrcMismatch(Exception):
    """An entry's bytes are not what torch.save wrote (its zip record's CRC-32 says so)."""


def _zip_problem(entry: memoryview) -> tuple[str, str] | None:
    """(finding code, why) for a whole entry (a torch.save zip) that fails its structure — its
    records' CRC-32s (``crc-mismatch``), a pickle that names code (its own code, not a CRC's) —
    or None when it passes or is no zip at all (a legacy pickle: the weights-only loader judges
    it, naming what it refuses)."""
    from drill.integrity.structure import zip_structure

    if bytes(entry[:4]) != b"PK\x03\x04":
        return None
    findings, _ = zip_structure(entry, "the entry")
    return (findings[0].code, findings[0].message.replace("the entry: ", "", 1)) if findings else None


def _read_in_place(
    reader: SequentialReader, item: Any, length: int, planner: Any, outcome: _FileOutcome, crc: bool = False
) -> memoryview | None:
    """Read one tensor entry's raw bytes straight into its target (through ``outcome.stagers``' host
    buffers when the target is on a GPU); None when done, else the head bytes consumed before
    finding that this entry cannot be read in place. With ``crc``, the bytes are checked
    against the record's CRC-32 as they land (:class:`CrcMismatch`) — a large entry's on the
    CRC lane, its verdict settled when the whole file is read (:func:`_settle`)."""
    start = reader.pos
    recs = tail_records(lambda at, n: reader.peek(start + at, n), length)
    data = [r for name, r in (recs or {}).items() if name.startswith("data/")]
    pkl = (recs or {}).get("data.pkl")
    if (
        len(data) != 1
        or pkl is None
        or not (data[0].stored and pkl.stored)
        or pkl.header_offset > data[0].header_offset
    ):
        return memoryview(b"")
    head = bytearray(reader.read(local_header_end(data[0])))
    nlen, elen = struct.unpack_from("<HH", head, data[0].header_offset + 26)
    head += reader.read(nlen + elen)
    view = memoryview(head)
    spec, pkl_at = None, data_start(view, pkl)
    if pkl_at is not None and data_start(view, data[0]) == len(head):
        spec = tensor_spec(view[pkl_at : pkl_at + pkl.size])
    target = planner.resolve_tensor(item).detach()
    if spec is None or pkl_at is None or not _fits(spec, data[0], item, target):
        return view
    if target.device.type == "cpu" and target.is_contiguous() and crc and length >= LANE_MIN:
        lane = outcome.lane.begin()
        if target.data_ptr() not in outcome.populated:  # a fresh target's pages, before the reads
            lane.populate(target.data_ptr(), target.numel() * target.element_size())
        reader.read_into(byte_view(target), lane)
        outcome.lane.end()  # the reader goes on to the next entry; the verdict is settled with the file
        outcome.unsettled.append((item, data[0], pkl, bytes(view[pkl_at : pkl_at + pkl.size]), _nbytes(target)))
        planner.commit_tensor(item, target)
        reader.skip_to(start + length)
        return None
    if target.device.type == "cpu" and target.is_contiguous():
        running = Crc() if crc else None
        reader.read_into(byte_view(target), running)
        got = running.value() if running is not None else None
    else:
        got = outcome.stagers(target.device).copy(reader, target, crc)
    if crc:
        assert got is not None  # a CRC was asked for, so one was computed
        _hold_to_crc(data[0], got, pkl, view[pkl_at : pkl_at + pkl.size])
    planner.commit_tensor(item, target)
    reader.skip_to(start + length)
    return None


def _populate_ahead(item: Any, planner: Any, outcome: _FileOutcome) -> None:
    """Have the next entry's target faulted in (:meth:`CrcLane.populate`) while the reader
    fills this one — for drill's own planners only, whose ``resolve_tensor`` gives the same
    target every time it is asked (a user's planner may allocate anew on each call)."""
    if not getattr(planner, "stable_targets", False) or is_byte_io(item):
        return
    target = planner.resolve_tensor(item)
    nbytes = target.numel() * target.element_size()
    if target.device.type == "cpu" and target.is_contiguous() and nbytes >= LANE_MIN:
        outcome.lane.populate(target.data_ptr(), nbytes)
        outcome.populated.add(target.data_ptr())


def _settle(outcome: _FileOutcome) -> None:
    """The lane's CRC-32s of the entries read in place, in the order they were read: an entry
    whose bytes fail theirs is a ``crc-mismatch`` and no longer counts as loaded."""
    for item, data, pkl, pkl_bytes, nbytes in outcome.unsettled:
        try:
            _hold_to_crc(data, outcome.lane.result(), pkl, memoryview(pkl_bytes))
        except CrcMismatch as exc:
            outcome.failures.append(
                ItemFailure(item.dest_index.fqn, outcome.record.relative_path, str(exc), code="crc-mismatch")
            )
            outcome.tensors -= 1
            outcome.tensor_bytes -= nbytes
    outcome.unsettled.clear()


def _hold_to_crc(data: Any, got: int, pkl: Any, pkl_bytes: memoryview) -> None:
    """:class:`CrcMismatch` unless the tensor's bytes (``got``: their CRC-32) and its
    ``data.pkl`` are what torch.save wrote."""
    if got != data.crc or crc32(pkl_bytes) != pkl.crc:
        raise CrcMismatch(
            f"the bytes of this tensor fail their CRC-32 (stored {data.crc:08x}, computed {got:08x}): damaged on storage"
        )


def _decode_in_place(blob: memoryview, item: Any, planner: Any) -> bool:
    """A small tensor entry, already in memory, decoded as a large one is read in place: its
    layout from the zip's central directory, its tensor from ``data.pkl`` by the restricted
    unpickler, its bytes held to their CRC-32s and copied into the target — a tenth of what
    a full ``zipfile`` pass and ``torch.load`` cost per entry. False for anything else (loaded
    the ordinary way); :class:`CrcMismatch` for damaged bytes."""
    recs = records(blob[len(blob) - min(len(blob), TAIL_BYTES) :], len(blob))
    data = [r for name, r in (recs or {}).items() if name.startswith("data/")]
    pkl = (recs or {}).get("data.pkl")
    if len(data) != 1 or pkl is None or not (data[0].stored and pkl.stored):
        return False
    data_at, pkl_at = data_start(blob, data[0]), data_start(blob, pkl)
    if data_at is None or pkl_at is None or data_at + data[0].size > len(blob) or pkl_at + pkl.size > len(blob):
        return False
    spec = tensor_spec(blob[pkl_at : pkl_at + pkl.size])
    target = planner.resolve_tensor(item).detach()
    if spec is None or not _fits(spec, data[0], item, target):
        return False
    raw = blob[data_at : data_at + data[0].size]
    _hold_to_crc(data[0], crc32(raw), pkl, blob[pkl_at : pkl_at + pkl.size])
    if target.device.type == "cpu" and target.is_contiguous():
        byte_view(target)[:] = raw
    else:
        target.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(target.dtype).reshape(target.shape))
    planner.commit_tensor(item, target)
    return True


def _fits(spec: TensorSpec, data: Any, item: Any, target: torch.Tensor) -> bool:
    """The stored tensor is exactly the target's bytes: contiguous, same dtype and shape, read whole."""
    nbytes = spec.storage_numel * element_size(spec.dtype)
    whole = not any(item.storage_offsets) and list(item.lengths) == list(spec.size)
    return (
        spec.contiguous
        and nbytes == data.size
        and target.dtype == spec.dtype
        and tuple(target.shape) == spec.size
        and whole
    )


def _load_tensor(blob: bytes, item: Any, planner: Any) -> tuple[str, str] | None:
    """The ordinary way: ``torch.load(weights_only=True)``, narrowed and copied into the target."""
    try:
        tensor = torch.load(cast("IO[bytes]", ViewReader(memoryview(blob))), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a bad entry is evidence, not a crash
        return load_failure(exc)
    try:
        tensor = narrow(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise ValueError(f"shape {tuple(tensor.size())} where metadata says {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(item, target)
    except Exception as exc:  # noqa: BLE001
        return "entry-not-loaded", one_line(exc)
    return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def restore(storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
    """Read every file of ``ref`` once — hashed as the plan says — and load every entry onto
    the device into targets allocated from the metadata, as a resume would."""
    result = RestoreResult(uri=ref.uri, format="dcp", device=str(ctx.device), index_file=DCP_METADATA)
    result.layout = Layout(format="dcp", required=parts.CANONICAL_PARTS, optimizer_keys="fqn")
    if ref.step is not None:
        result.layout.step_counters["directory name"] = ref.step
    reader = DrillReader(storage, ref.uri, result, ctx)
    try:
        metadata = reader.read_metadata()
    except MetadataUnreadable as exc:
        result.metadata_error = str(exc)
        return result
    result.index = metadata.storage_data
    result.layout.saved_ranks = saved_ranks(metadata)
    sizes = file_sizes(storage, ref.uri, metadata)
    try:
        result.inventory = inventory(metadata)
        need = claimed_bytes(metadata, sizes)
    except ValueError as exc:  # the index claims what the files cannot hold: allocate nothing
        result.metadata_error, result.metadata_code = f"{DCP_METADATA}: {exc}", "metadata-implausible"
        return result
    check_budget(need, ctx)
    ctx.progress.phase("read", total_bytes=sum(sizes.values()))
    state = skeleton(metadata, ctx.device)
    planner = TargetPlanner(state, result.failures)
    reader.set_up_storage_reader(metadata, True)
    reader.read_items(read_items(metadata), planner)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    result.values_loaded = planner.values_loaded
    result.state = state
    apply_layout(result, storage, ref, ctx)
    return result
