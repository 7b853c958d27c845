"""The demo run's restorable state: one ``Stateful`` per canonical part.

``dcp.save`` calls ``state_dict()`` on each, ``dcp.load`` calls ``load_state_dict()``. Every
value is a tensor or a plain number, so a restore never needs to unpickle an object.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


class ModelState:
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


class WarmupCosine:
    """Linear warm-up then cosine decay to 10%; a callable object, so LambdaLR saves it."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(kw_only=True, slots=True)
class TrainState:
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
        _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
        state: dict[str, Any] = {
            "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": gauss},
            "numpy": {
                "keys": torch.from_numpy(np_keys.astype(np.int64)),
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
            ("MT19937", nps["keys"].numpy().astype(np.uint32), int(nps["pos"]), int(nps["has_gauss"]), float(nps["cached_gaussian"]))
        )
        torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            for i, s in state["cuda"].items():
                torch.cuda.set_rng_state(s.cpu(), int(i))
