"""The format contract: everything drill knows about one kind of checkpoint, asked in one place.

A :class:`Format` (one module per format, one line in :mod:`drill.formats`' registry) owns:

- **recognising** its checkpoints and what makes one complete: a directory (or a file) it
  wrote is a complete save (a :class:`~drill.checkpoints.CheckpointRef`, with its step), an
  unfinished one (an :class:`~drill.checkpoints.IncompleteSave`: its commit marker missing), or
  not its own; and the files at a run's top that are a final export, not a checkpoint;
- its **resume pointers**: what its trainer's auto-resume would pick (a ``latest`` file,
  Megatron's tracker, the highest ``checkpoint-N``);
- its **structural proof** when unsealed, made without loading (``drill verify``), the one
  ``drill run`` agrees with;
- **restoring** it into the canonical view (``part.key.path``): every file read once through the
  :class:`~drill.storage.Storage` (hashed as the plan says), every entry loaded onto the device
  or recorded as a failure, the facts it knows about itself (its
  :class:`~drill.formats.canonical.Layout`: the parts it saves and never saves, how its
  optimizer is laid out, its step counters), held to the memory budget (:func:`check_budget`)
  before anything is allocated — never raising for a damaged checkpoint;
- whether a replay can load it through DCP, and whether many ranks can share its restore.

Nothing outside a format names a format: discovery, ``verify``, ``run``, the SDK and distributed
drills ask the registered formats. A format's module imports nothing heavy at its top (listing
a run and ``drill verify`` of a sealed checkpoint never import torch).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave
from drill.errors import one_line  # noqa: F401 - where the format adapters import it from
from drill.integrity.hashing import HashPlan
from drill.integrity.reading import describe_read_error, read_whole
from drill.restore import FileRead, ItemFailure, NullProgress, Progress, RestoreResult
from drill.storage import Entry, Listing, Storage

if TYPE_CHECKING:
    import torch

    from drill.findings import Finding


@dataclass(slots=True, kw_only=True)
class RestoreContext:
    """What an adapter needs besides the checkpoint: where to load, what to hash, what to allow."""

    device: torch.device
    progress: Progress = field(default_factory=NullProgress)
    hash_plan: HashPlan = field(default_factory=HashPlan)
    allow_classes: tuple[str, ...] = ()
    """Classes a layout legitimately pickles, allow-listed by the user or policy."""
    memory_budget: int | None = None
    """Bytes the restored state may occupy on the device; a checkpoint claiming more is
    refused with a finding before anything is allocated. None: no limit."""
    shard: Any = None
    """This rank's :class:`~drill.restore.partition.Shard` when many ranks restore the
    checkpoint together; None: this process restores all of it."""


Structure = tuple[list["Finding"], dict[str, Any]]
"""A structural proof: its findings (empty when consistent) and the evidence it examined."""


class Format(ABC):
    """One kind of checkpoint (see the module's docstring); the defaults say "not mine", and
    :meth:`restore` — what makes a format one — every format must write."""

    name: str = ""
    """The ``--format`` name, and the ``format`` a :class:`CheckpointRef` carries."""
    label: str = ""
    """What people call it (``DeepSpeed ZeRO``): for evidence and the README's formats table."""
    replays_through_dcp: bool = False
    """A replay loads it into the entrypoint's ``Stateful`` objects through drill's safe DCP
    reader; otherwise only an entrypoint that defines ``restore(path)`` can replay it."""
    restores_across_ranks: bool = False
    """A distributed drill splits its files among the ranks; otherwise rank 0 restores it all."""
    fallback: bool = False
    """It claims what no other format does (a writer drill was not taught): in a run whose
    other saves a format knows, what it claims is their writer's unfinished save instead."""

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        """The directory ``uri`` (named ``name``, holding ``entries``): one of this format's
        complete saves, an unfinished one, or None when it is not this format's. Every format
        is asked of every directory: look up the names it could own in ``entries``' index
        (:meth:`~drill.storage.Listing.get`, :meth:`~drill.storage.Listing.suffixed`), never
        scan all of them."""
        return None

    def recognize_file(self, entry: Entry) -> CheckpointRef | None:
        """A single file at a run's top that is one of this format's checkpoints, or None."""
        return None

    def is_export(self, ref: CheckpointRef, entries: list[Entry]) -> bool:
        """Whether a directory it recognized is a final model export, not a resumable save."""
        return False

    def exports(self, entries: list[Entry]) -> list[str]:
        """Files at a run's top that are this format's final export (reported, never drilled)."""
        return []

    def pointers(
        self, storage: Storage, root: str, entries: dict[str, Entry], found: Discovery
    ) -> list[tuple[str, str]]:
        """(who follows it, the checkpoint name it names) for each resume pointer of this
        format's trainer that the run root holds."""
        return []

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        """The structural proof of an unsealed checkpoint of this format, made without loading
        it (``sizes``: its files as listed); None when the format has none."""
        return None

    def view_of(self, obj: Any) -> tuple[dict[str, Any], Any] | None:
        """The canonical view and layout of an object loaded from a ``torch.save`` file, when
        this format knows it by its shape whatever the file is called (Composer's ``state``
        beside ``rng``); None when it is not this format's."""
        return None

    def every_save(self, name: str) -> bool:
        """Whether its writer writes the file ``name`` (at a checkpoint's top) on every save of a
        run once it has written it in one: absent from this save while the run's other saves
        hold it, it is damage (accelerate's ``dl_state_dict.bin``, whose own ``load_state``
        skips it silently), never a configuration that saves no such state."""
        return False

    def writers(self, sizes: dict[str, int]) -> list[int]:
        """The ranks that wrote the checkpoint, where its file names say (empty: they do not)."""
        return []

    @abstractmethod
    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """Read and load ``ref``; every problem is recorded in the result, never raised."""

    def restored_structure(
        self, result: RestoreResult, storage: Storage, uri: str, sizes: dict[str, int]
    ) -> Structure | None:
        """The structural proof of a checkpoint once :meth:`restore` has read it (the same
        verdict :meth:`structure` gives without loading; by default what the restore found)."""
        return result.structure

    def missing_files(self, sizes: dict[str, int], result: RestoreResult) -> list[Finding]:
        """Files the format's own naming says should be there beyond those the restore
        recorded as missing (DCP's shards when its index could not be read)."""
        return []

    def finish_merged(self, result: RestoreResult, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> None:  # noqa: B027 - an optional hook
        """Rank 0 of a distributed drill, with every rank's share merged into ``result``:
        what :meth:`restore` does once the state is complete (a trainer's layout applied)."""


def restore_nested(
    fmt: Format, storage: Storage, outer: CheckpointRef, subdir: str, ctx: RestoreContext, result: RestoreResult
) -> RestoreResult:
    """Restore the checkpoint ``fmt`` wrote in ``subdir`` of ``outer`` (accelerate's FSDP
    sub-directories, the Trainer's DeepSpeed ``global_stepN/``) as part of ``outer``: one
    checkpoint, its files named relative to ``outer`` and recorded in ``result``."""
    from dataclasses import replace

    ref = CheckpointRef(
        uri=storage.child(outer.uri, subdir), name=subdir, step=outer.step, format=fmt.name, mtime=outer.mtime
    )
    sub = fmt.restore(storage, ref, replace(ctx, hash_plan=ctx.hash_plan.under(subdir + "/")))
    for f in sub.files:
        f.relative_path = f"{subdir}/{f.relative_path}"
    for failure in sub.failures:
        if failure.relative_path is not None:
            failure.relative_path = f"{subdir}/{failure.relative_path}"
    result.files += sub.files
    result.failures += sub.failures
    result.read_seconds += sub.read_seconds
    result.load_seconds += sub.load_seconds
    if sub.metadata_error is not None:
        result.failures.append(
            ItemFailure(
                subdir,
                subdir,
                f"the checkpoint in {subdir}/ cannot be loaded ({sub.metadata_error})",
                code=sub.metadata_code or "metadata-unreadable",
            )
        )
    return sub


def restored_nested_structure(fmt: Format, sub: RestoreResult, storage: Storage, subdir: str) -> Structure | None:
    """``fmt``'s structural proof of the checkpoint :func:`restore_nested` read from ``subdir``,
    its subjects named within the outer checkpoint, its evidence under ``subdir``."""
    from dataclasses import replace

    sizes = {f.relative_path[len(subdir) + 1 :]: f.size for f in sub.files if f.size is not None}
    proof = fmt.restored_structure(sub, storage, sub.uri, sizes)
    if proof is None:
        return None
    named = [replace(f, subject=f"{subdir}/{f.subject}") if f.subject and "/" not in f.subject else f for f in proof[0]]
    return named, {subdir: proof[1]}


def nested_structure(
    fmt: Format, storage: Storage, uri: str, subdir: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
) -> Structure | None:
    """``fmt``'s structural proof of the checkpoint in ``subdir``, its subjects named relative to ``uri``."""
    from dataclasses import replace

    prefix = subdir + "/"
    proof = fmt.structure(
        storage,
        storage.child(uri, subdir),
        {p[len(prefix) :]: n for p, n in sizes.items() if p.startswith(prefix)},
        allow_classes,
    )
    if proof is None:
        return None
    findings, evidence = proof
    named = [
        replace(f, subject=f"{prefix}{f.subject}")
        if f.subject and not f.subject.startswith(("/", prefix)) and "://" not in f.subject
        else f
        for f in findings
    ]
    return named, {subdir: evidence}


POINTER_FIELDS = ("latest", "latest_checkpoint", "last_checkpoint", "checkpoint", "path", "name", "step", "iteration")
"""Fields of a JSON pointer file that name the checkpoint it points at, the most telling first."""


def read_pointer(storage: Storage, root: str, entry: Entry | None) -> str | None:
    """The checkpoint name a pointer at the run's top names (None: absent or unreadable): a
    symlink's target, a text file's first line, or a JSON file's field naming it (a path's
    last component; a number is a step)."""
    if entry is None:
        return None
    if entry.link_target is not None:
        return entry.link_target.rstrip("/").rsplit("/", 1)[-1] or None
    if not entry.is_file:
        return None
    try:
        with storage.open(storage.child(root, entry.name)) as f:
            text = f.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return _pointer_text(text)


def _pointer_text(text: str) -> str | None:
    if text.startswith("{"):
        from drill import safe_json

        try:
            doc = safe_json.loads(text.encode())
        except ValueError:
            return text.splitlines()[0][:200]  # named as written: not a checkpoint here
        value = next((doc[k] for k in POINTER_FIELDS if isinstance(doc, dict) and k in doc), None)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return None
        return str(value).rstrip("/").rsplit("/", 1)[-1] or None
    line = text.splitlines()[0].strip() if text else ""
    return line.rstrip("/").rsplit("/", 1)[-1] or None


def read_file(
    storage: Storage, base: str, relative: str, size: int | None, ctx: RestoreContext, result: RestoreResult
) -> memoryview | None:
    """Read one file of the checkpoint into memory, hashed as the plan says, and record it in
    ``result.files``; None (with the error recorded) when it cannot be read. An empty
    ``relative`` reads ``base`` itself (a single-file checkpoint)."""
    record = FileRead(relative or base.rstrip("/").rsplit("/", 1)[-1], size)
    result.files.append(record)
    started = time.perf_counter()
    try:
        uri = storage.child(base, relative) if relative else base
        if record.size is None:
            record.size = storage.stat(uri).size
        got = read_whole(
            storage,
            uri,
            record.size,
            ctx.progress.advance,
            hash=ctx.hash_plan.wants(relative),
            chunk_size=ctx.hash_plan.chunk_size,
            sha256=relative in ctx.hash_plan.sha256,
        )
    except (OSError, EOFError) as exc:
        record.error, record.error_kind = describe_read_error(exc)
        return None
    finally:
        result.read_seconds += time.perf_counter() - started
    record.hashes, record.retries, record.bytes_read = got.hashes, got.retries, len(got.view)
    return got.view


def check_budget(need: int, ctx: RestoreContext) -> None:
    """Refuse, before allocating, a restore that would not fit the device's memory: the one
    budget every format is held to (``need`` is what its index or archive claims)."""
    from drill.errors import ResourceLimit
    from drill.units import human_bytes

    budget = ctx.memory_budget if ctx.memory_budget is not None else available_memory(ctx.device)
    if budget is not None and need > budget:
        raise ResourceLimit(
            f"restoring this checkpoint needs {human_bytes(need)} on {ctx.device}, which has {human_bytes(budget)} available"
        )


def available_memory(device: torch.device) -> int | None:
    """What the device can still allocate: CUDA's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def tally(result: RestoreResult, state: dict[str, Any]) -> None:
    """Count what landed: tensors, their bytes, and plain values."""
    import torch

    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    result.tensors_loaded = len(tensors)
    result.tensor_bytes = sum(t.numel() * t.element_size() for t in tensors)
    result.values_loaded = len(state) - len(tensors)
