"""PyTorch Distributed Checkpoint (``dcp.save``) directories — torchtitan's ``step-N/``, the
demo run's, Megatron-core's ``iter_NNNNNNN/``, Lightning's sharded ``.ckpt/`` — as one format.

- **complete** when DCP's ``.metadata`` is there (written last); shards without it, or a
  Megatron save without its ``metadata.json`` (written after ``.metadata``), never finished;
- **resume pointer**: Megatron's ``latest_checkpointed_iteration.txt``;
- **structure** when unsealed: ``.metadata``'s entries against the shards, and the side files
  the trainer's layout keeps beside them (:mod:`drill.formats.dcp_layout`);
- **restore**: drill's own reader, every chunk into targets allocated from the index
  (:mod:`drill.formats.dcp_read`), shared among ranks by file in a distributed drill; a replay
  loads it through DCP into the trainer's objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave, step_of
from drill.formats.base import Format, RestoreContext, Structure
from drill.formats.dcp_names import DCP_METADATA, MEGATRON_COMMON, MEGATRON_CONFIG, MEGATRON_TRACKER, SHARD_SUFFIX
from drill.restore import RestoreResult
from drill.storage import Entry, Listing, Storage
from drill.units import decimal

if TYPE_CHECKING:
    from drill.findings import Finding


class DCP(Format):
    name = "dcp"
    label = "PyTorch DCP (torchtitan, Megatron-core torch_dist, Lightning FSDP sharded, dcp.save)"
    marker = DCP_METADATA
    replays_through_dcp = True
    restores_across_ranks = True

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        step = step_of(name)
        meta = entries.get(DCP_METADATA)
        if meta is not None and entries.get(MEGATRON_COMMON) is not None and entries.get(MEGATRON_CONFIG) is None:
            why = f"Megatron save with {MEGATRON_COMMON} and {DCP_METADATA} but no {MEGATRON_CONFIG}, which dist_checkpointing writes last: the save never finished"
            return IncompleteSave(uri=uri, name=name, step=step, reason=why)
        if meta is not None and meta.is_file:
            return CheckpointRef(uri=uri, name=name, step=step, format=self.name, mtime=meta.mtime)
        if entries.suffixed(SHARD_SUFFIX):
            return IncompleteSave(
                uri=uri, name=name, step=step, reason=f"DCP shards but no {DCP_METADATA}: the save never finished"
            )
        return None

    def pointers(
        self, storage: Storage, root: str, entries: dict[str, Entry], found: Discovery
    ) -> list[tuple[str, str]]:
        from drill.formats.base import read_pointer

        target = read_pointer(storage, root, entries.get(MEGATRON_TRACKER))
        if not target:
            return []
        return [(MEGATRON_TRACKER, f"iter_{n:07d}" if (n := decimal(target)) is not None else target)]

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.formats.dcp_layout import structure

        return structure(storage, uri, sizes, allow_classes)

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        if ctx.shard is not None:  # one rank's share of a restore by many ranks
            from drill.formats.dcp_shard import restore_shard

            return restore_shard(storage, ref, ctx, ctx.shard)
        from drill.formats.dcp_read import restore

        return restore(storage, ref, ctx)

    def restored_structure(
        self, result: RestoreResult, storage: Storage, uri: str, sizes: dict[str, int]
    ) -> Structure | None:
        if DCP_METADATA not in sizes or (result.index is None and result.metadata_error is None):
            return None
        from drill.formats.dcp_layout import unsealed_structure

        return unsealed_structure(
            storage, uri, sizes, result.index, (result.metadata_error or "").removeprefix(f"{DCP_METADATA}: ")
        )

    def writers(self, sizes: dict[str, int]) -> list[int]:
        from drill.formats.dcp_names import SHARD

        return sorted({int(m.group(1)) for n in sizes if (m := SHARD.match(n))})

    def missing_files(self, sizes: dict[str, int], result: RestoreResult) -> list[Finding]:
        if result.index is not None:
            return []  # the restore named every file its index places entries in
        from drill.integrity.structure import shard_gaps

        return shard_gaps(sizes)  # no index to name the shards: the listing does

    def finish_merged(self, result: RestoreResult, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> None:
        from drill.formats.dcp_layout import apply_layout

        apply_layout(result, storage, ref, ctx)


__all__ = ["DCP", "DCP_METADATA"]
