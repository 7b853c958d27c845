"""What the original run did after the checkpoint: its step record.

Sources, first found wins:

- drill's step log, ``drill-steps.jsonl`` in the run directory (:class:`drill.sdk.StepLog`):
  loss, grad norm and batch fingerprint per step;
- Hugging Face Trainer's ``trainer_state.json`` ``log_history`` (loss, grad_norm at each
  logging step) in the newest checkpoint that has one;
- Lightning's CSV logger, ``metrics.csv`` (a ``step`` column and a ``*loss*`` column) under
  the run directory;
- TensorBoard scalar event files (``events.out.tfevents.*``; a ``loss`` tag), read with the
  ``tensorboard`` package when it is installed.

Frameworks' logs have no batch fingerprints: data order is then not compared, and the
evidence says so.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from drill import safe_json
from drill.checkpoints import step_of
from drill.replay.compare import Divergence
from drill.runlog.steplog import RANK_LOG, STEP_LOG, StepRecord, parse_step_log
from drill.storage import Storage, scheme_of, storage_for
from drill.storage.local import read_regular


@dataclass(slots=True)
class Reference:
    source: str
    steps: dict[int, StepRecord] = field(default_factory=dict)
    device: str | None = None
    """Device type the original run trained on, where recorded."""
    ranks: dict[int, dict[int, StepRecord]] = field(default_factory=dict)
    """Each rank's own record, where ranks keep one (``drill-steps.rank<r>.jsonl``)."""
    resumed: Divergence | None = None
    """The first step that a resumed run logged again with another batch than the run first
    saw there: its data did not continue where it left off (the step log keeps both)."""


MAX_LOG_BYTES = 256 << 20


def _read_text(storage: Storage, uri: str) -> str | None:
    """A small text file of the run, or None when it is not there (or not a file)."""
    try:
        with storage.open(uri) as f:
            data = f.read(MAX_LOG_BYTES + 1)
    except OSError:
        return None
    return data[:MAX_LOG_BYTES].decode("utf-8", "replace")


def _from_step_log(storage: Storage, run_dir: str) -> Reference | None:
    text = _read_text(storage, storage.child(run_dir, STEP_LOG))
    if text is None:
        return None
    records = parse_step_log(text.splitlines())
    ref = Reference(source=STEP_LOG, steps={r.step: r for r in records}, resumed=_resumed_off(records))
    for rank, rank_records in _rank_logs(storage, run_dir):
        ref.ranks[rank] = {r.step: r for r in rank_records}
        off = _resumed_off(rank_records, rank)
        if off is not None and (ref.resumed is None or (off.step, rank) < (ref.resumed.step, _order(ref.resumed.rank))):
            ref.resumed = off
    run_json = _read_text(storage, storage.child(run_dir, "run.json"))
    try:
        doc = safe_json.loads(run_json) if run_json else {}
        ref.device = doc.get("device") if isinstance(doc, dict) and isinstance(doc.get("device"), str) else None
    except (ValueError, RecursionError):
        pass
    return ref


def _order(rank: int | None) -> int:
    """Where the run's own log sorts among ranks' logs at one step: after them all."""
    return 1 << 62 if rank is None else rank


def _resumed_off(records: list[StepRecord], rank: int | None = None) -> Divergence | None:
    """A run resumed from a checkpoint logs the steps after it again: each must see the batch
    the run first saw at that step. The first that does not, or None."""
    first: dict[int, StepRecord] = {}
    found: Divergence | None = None
    for r in records:
        seen = first.setdefault(r.step, r)
        if seen is not r and seen.batch and r.batch and seen.batch != r.batch:
            if found is None or r.step < found.step:
                found = Divergence(r.step, "data", seen.batch, r.batch, rank=rank)
    return found


def _rank_logs(storage: Storage, run_dir: str) -> list[tuple[int, list[StepRecord]]]:
    """Each rank's own step log (``drill-steps.rank<r>.jsonl``), where ranks keep them."""
    try:
        names = [e.name for e in storage.list(run_dir) if not e.is_dir]
    except OSError:
        return []
    logs = []
    for name in sorted(names):
        matched = RANK_LOG.match(name)
        text = _read_text(storage, storage.child(run_dir, name)) if matched else None
        if matched and text is not None:
            logs.append((int(matched.group(1)), parse_step_log(text.splitlines())))
    return logs


def _from_hf(storage: Storage, run_dir: str) -> Reference | None:
    try:
        entries = storage.list(run_dir)
    except OSError:
        return None
    dirs = sorted((step_of(e.name) or -1, e.name) for e in entries if e.is_dir and e.name.startswith("checkpoint-"))
    states = [storage.child(run_dir, f"{name}/trainer_state.json") for _, name in dirs]
    states.append(storage.child(run_dir, "trainer_state.json"))
    for uri in reversed(states):
        text = _read_text(storage, uri)
        try:
            doc = safe_json.loads(text) if text else None
        except (ValueError, RecursionError):
            continue
        history = doc.get("log_history", []) if isinstance(doc, dict) else []
        steps = {}
        for h in history if isinstance(history, list) else []:
            loss, step = (
                _float(h.get("loss")) if isinstance(h, dict) else None,
                h.get("step") if isinstance(h, dict) else None,
            )
            if loss is not None and isinstance(step, int):
                steps[step] = StepRecord(step=step, loss=loss, grad_norm=_float(h.get("grad_norm")))
        if steps:
            return Reference(source=f"{uri[len(run_dir) + 1 :]} log_history", steps=steps)
    return None


def _from_lightning_csv(run_dir: Path) -> Reference | None:
    for path in sorted(run_dir.rglob("metrics.csv"), key=os.path.getmtime, reverse=True):
        try:  # the run's own file: never a FIFO, never past the log limit
            rows = list(csv.DictReader(read_regular(path, MAX_LOG_BYTES).decode("utf-8", "replace").splitlines()))
        except (OSError, ValueError, csv.Error):
            continue
        if not rows:
            continue
        loss_col = next((c for c in rows[0] if c in ("train_loss", "loss", "train_loss_step")), None) or next(
            (c for c in rows[0] if "loss" in c), None
        )
        if loss_col is None or "step" not in rows[0]:
            continue
        steps = {}
        for row in rows:
            if row.get(loss_col) not in (None, "") and row.get("step") not in (None, ""):
                try:  # Lightning logs the step index *before* the optimizer step (0-based).
                    step, loss = int(float(row["step"])) + 1, float(row[loss_col])
                except (ValueError, OverflowError):  # "inf", "nan", not a number: no step of the run
                    continue
                steps[step] = StepRecord(step=step, loss=loss)
        if steps:
            return Reference(source=f"{path.relative_to(run_dir)} ({loss_col})", steps=steps)
    return None


def _from_tensorboard(run_dir: Path) -> Reference | None:
    files = sorted(run_dir.rglob("events.out.tfevents.*"))
    if not files:
        return None
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return None
    for path in files:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags().get("scalars", [])
        tag = next((t for t in tags if t in ("loss", "train/loss", "train_loss")), None) or next(
            (t for t in tags if "loss" in t), None
        )
        if tag is None:
            continue
        steps = {e.step: StepRecord(step=e.step, loss=float(e.value)) for e in acc.Scalars(tag)}
        if steps:
            return Reference(source=f"{path.relative_to(run_dir)} ({tag})", steps=steps)
    return None


def load_reference(run_dir: str | os.PathLike[str], storage: Storage | None = None) -> Reference | None:
    """The original run's record, from the first source that has one; None when none does.

    The step log and Hugging Face's trainer state are read through ``storage`` (an object
    store too); Lightning's CSV and TensorBoard events only from a local run directory.
    """
    uri = os.fspath(run_dir)
    storage = storage or storage_for(uri)
    for importer in (_from_step_log, _from_hf):
        ref = importer(storage, uri)
        if ref is not None and ref.steps:
            return ref
    if scheme_of(uri) != "file" or not Path(uri).is_dir():
        return None
    for local in (_from_lightning_csv, _from_tensorboard):
        ref = local(Path(uri))
        if ref is not None and ref.steps:
            return ref
    return None


def _float(value: object) -> float | None:
    try:
        return None if value is None else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
