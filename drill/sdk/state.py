"""``Stateful`` helpers for a trainer's checkpoint: one object per part of the state a resume
needs, each with ``state_dict()``/``load_state_dict()`` as ``dcp.save``/``dcp.load`` (and
``drill.sdk.save``/``drill.sdk.load``) call them. Every value they save is a tensor or a plain
number, so a restore never unpickles an object.

    state = {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "lr_scheduler": scheduler,           # torch's schedulers are Stateful already
        "dataloader": loader,                # yours: its position *and* its shuffle order
        "rng": RNGState(),
        "train_state": TrainState(),
    }
    drill.sdk.save(state, checkpoint_id=ckpt_dir)

:func:`fingerprint` names a batch by its contents, for the step log that a replay compares.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


class ModelState:
    """A model's weights, keyed by parameter name (DCP's state-dict helpers: FSDP and DDP included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state)


class OptimizerState:
    """Optimizer state keyed by parameter name (not index), as DCP requires."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state)


@dataclass(kw_only=True, slots=True)
class TrainState:
    """The loop's own counters: the step reached and the tokens seen."""

    step: int = 0
    tokens_seen: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])


class RNGState:
    """Every generator the run draws from: python, numpy, torch CPU and each CUDA device."""

    def state_dict(self) -> dict[str, Any]:
        version, py_state, gauss = random.getstate()
        _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
        state: dict[str, Any] = {
            "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": gauss},
            "numpy": {
                "keys": torch.from_numpy(np.asarray(np_keys).astype(np.int64)),
                "pos": int(np_pos),
                "has_gauss": int(np_has_gauss),
                "cached_gaussian": float(np_gauss),
            },
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = {str(i): s for i, s in enumerate(torch.cuda.get_rng_state_all())}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        py = state["python"]
        random.setstate((int(py["version"]), tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
        nps = state["numpy"]
        np.random.set_state(
            (
                "MT19937",
                nps["keys"].numpy().astype(np.uint32),
                int(nps["pos"]),
                int(nps["has_gauss"]),
                float(nps["cached_gaussian"]),
            )
        )
        torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            for i, s in state["cuda"].items():
                torch.cuda.set_rng_state(s.cpu(), int(i))


class PerRank:
    """State each rank holds its own of (its data-loader position, its RNG streams), saved under
    ``rank_<r>`` so that N ranks' copies sit side by side in one checkpoint; each rank loads
    its own back (a replay by fewer ranks, the first ones')."""

    def __init__(self, inner: Any, rank: int) -> None:
        self.inner, self.key = inner, f"rank_{rank}"

    def state_dict(self) -> dict[str, Any]:
        return {self.key: self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state[self.key])


def fingerprint(batch: torch.Tensor) -> str:
    """xxh3-64 of a batch's bytes: the data order, comparable across runs and devices (what
    :meth:`drill.sdk.StepLog.append` records as ``batch`` and a replay compares exactly). Hash
    the batch as it comes from the loader (token ids, or inputs before any device cast)."""
    flat = batch.detach().to("cpu").contiguous().reshape(-1)
    return xxhash.xxh3_64_hexdigest(flat.view(torch.uint8).numpy().tobytes())


__all__ = ["ModelState", "OptimizerState", "PerRank", "RNGState", "TrainState", "fingerprint"]
