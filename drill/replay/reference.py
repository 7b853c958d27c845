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
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from drill.sdk.steplog import STEP_LOG, StepRecord, read_step_log


@dataclass(slots=True)
class Reference:
    source: str
    steps: dict[int, StepRecord] = field(default_factory=dict)
    device: str | None = None
    """Device type the original run trained on, where recorded."""

    @property
    def has_data_order(self) -> bool:
        return any(r.batch for r in self.steps.values())


def _from_step_log(run_dir: Path) -> Reference | None:
    if not (run_dir / STEP_LOG).is_file():
        return None
    ref = Reference(source=STEP_LOG, steps={r.step: r for r in read_step_log(run_dir)})
    run_json = run_dir / "run.json"
    if run_json.is_file():
        try:
            ref.device = json.loads(run_json.read_text()).get("device")
        except json.JSONDecodeError:
            pass
    return ref


def _from_hf(run_dir: Path) -> Reference | None:
    states = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name.split("-")[-1].isdigit() else -1)
    if (run_dir / "trainer_state.json").is_file():
        states.append(run_dir / "trainer_state.json")
    for path in reversed(states):
        try:
            history = json.loads(path.read_text()).get("log_history", [])
        except (json.JSONDecodeError, OSError):
            continue
        steps = {
            int(h["step"]): StepRecord(step=int(h["step"]), loss=float(h["loss"]), grad_norm=_float(h.get("grad_norm")))
            for h in history
            if "loss" in h and "step" in h
        }
        if steps:
            return Reference(source=f"{path.relative_to(run_dir)} log_history", steps=steps)
    return None


def _from_lightning_csv(run_dir: Path) -> Reference | None:
    for path in sorted(run_dir.rglob("metrics.csv"), key=os.path.getmtime, reverse=True):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
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
                # Lightning logs the step index *before* the optimizer step (0-based).
                step = int(float(row["step"])) + 1
                steps[step] = StepRecord(step=step, loss=float(row[loss_col]))
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
        tag = next((t for t in tags if t in ("loss", "train/loss", "train_loss")), None) or next((t for t in tags if "loss" in t), None)
        if tag is None:
            continue
        steps = {e.step: StepRecord(step=e.step, loss=float(e.value)) for e in acc.Scalars(tag)}
        if steps:
            return Reference(source=f"{path.relative_to(run_dir)} ({tag})", steps=steps)
    return None


def load_reference(run_dir: str | os.PathLike[str]) -> Reference | None:
    """The original run's record, from the first source that has one; None when none does."""
    root = Path(run_dir)
    if not root.is_dir():
        return None
    for importer in (_from_step_log, _from_hf, _from_lightning_csv, _from_tensorboard):
        ref = importer(root)
        if ref is not None and ref.steps:
            return ref
    return None


def _float(value: object) -> float | None:
    try:
        return None if value is None else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
