"""``dcp.load`` through drill's reader: for loading into live ``Stateful`` objects (the
replay's training objects, the SDK's verified resume) with DCP's own planning — resharding,
process groups, ``state_dict()``/``load_state_dict()`` — and drill's safety: ``.metadata``
through the allow-list unpickler, values with ``weights_only=True``, each file read once and
hashed, every failure recorded. Importing this module imports DCP."""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint import StorageReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from drill.formats.base import RestoreContext
from drill.formats.dcp_read import DrillReader, load_value
from drill.restore import ItemFailure, RestoreResult
from drill.safe_pickle import restricted_loads
from drill.storage import Storage


@dataclass(frozen=True, slots=True)
class KeyMatch:
    """How live objects' state dict meets a checkpoint's, key by key (flattened FQNs)."""

    missing: list[str]
    """Keys the objects ask for that the checkpoint does not hold (the load fails on them)."""
    untaken: list[str]
    """Keys the checkpoint holds that the objects do not ask for: state a resume silently drops."""


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but values load with ``weights_only=True`` and a value that will
    not deserialize becomes a recorded failure instead of an exception."""

    stable_targets = True
    """``resolve_tensor`` is DCP's own: a view of the state dict's tensor, the same each time
    it is asked — so the reader may ask for the next entry's ahead, to fault its pages in."""

    def __init__(
        self, failures: list[ItemFailure], *, flatten: bool = True, on_keys: Callable[[KeyMatch], None] | None = None
    ) -> None:
        super().__init__(flatten_state_dict=flatten, flatten_sharded_tensors=flatten)
        self._failures = failures
        self._on_keys = on_keys
        self.values_loaded = 0

    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if self._on_keys is not None and metadata is not None:
            wanted, saved = set(self.state_dict), set(metadata.state_dict_metadata)
            self._on_keys(KeyMatch(missing=sorted(wanted - saved), untaken=sorted(saved - wanted)))

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        ok, obj = load_value(value, fqn, self._failures)
        if not ok:
            return
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
        self.values_loaded += 1


class DCPStorageReader(DrillReader, StorageReader):
    """:class:`~drill.formats.dcp.DrillReader` speaking DCP's ``StorageReader`` protocol."""

    @staticmethod
    def loads(data: bytes, allowed: frozenset[tuple[str, str]]) -> Any:
        metadata = restricted_loads(data, allowed)  # DCP's own classes: its planner checks them
        if isinstance(metadata, Metadata) and getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            self.uri = str(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return True

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        self.read_items(plan.items, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut


def dcp_load(
    state: dict[str, Any], reader: DCPStorageReader, planner: Any, process_group: Any = None, distributed: bool = False
) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        # A single-process load is intended; DCP warns about it on every call.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, planner=planner, process_group=process_group, no_dist=not distributed)


def load_into(
    storage: Storage,
    uri: str,
    stateful: dict[str, Any],
    *,
    distributed: bool = False,
    on_keys: Callable[[KeyMatch], None] | None = None,
) -> None:
    """Load a DCP checkpoint into live training objects (``Stateful``s), the way a resume
    does, through drill's safe reader; raises on anything that does not load. ``distributed``:
    this process is one rank of a process group, loading its share as the group plans it.
    ``on_keys`` hears how the objects' keys meet the checkpoint's before anything is read (it
    may raise to stop the load)."""
    from drill.integrity.hashing import HashPlan
    from drill.restore import NullProgress

    result = RestoreResult(uri=uri, format="dcp", device="")
    ctx = RestoreContext(device=torch.device("cpu"), progress=NullProgress(), hash_plan=HashPlan(files=frozenset()))
    reader = DCPStorageReader(storage, uri, result, ctx)
    dcp_load(stateful, reader, SafeLoadPlanner(result.failures, on_keys=on_keys), distributed=distributed)
    problems = [f.reason for f in result.failures] + [f"{f.relative_path}: {f.error}" for f in result.files if f.error]
    if result.metadata_error or problems:
        raise RuntimeError(f"checkpoint did not load into the training objects: {result.metadata_error or problems[0]}")


__all__ = ["DCPStorageReader", "KeyMatch", "SafeLoadPlanner", "dcp_load", "load_into"]
