"""A synthetic token stream and a data loader whose state restores position *and* order."""

from __future__ import annotations

from typing import Any

import torch
import xxhash


def synthetic_corpus(vocab_size: int, length: int, seed: int) -> torch.Tensor:
    """A token stream with learnable structure: a sparse random Markov chain.

    Each token has four likely successors, so a model can drive the loss from ln(vocab)
    towards ln(4) — a run whose loss genuinely goes down.
    """
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, vocab_size, (vocab_size, 4), generator=g)
    choice = torch.randint(0, 4, (length,), generator=g)
    noise = torch.rand(length, generator=g) < 0.05
    random_tokens = torch.randint(0, vocab_size, (length,), generator=g)
    tokens = torch.empty(length, dtype=torch.long)
    tokens[0] = 0
    for i in range(1, length):
        nxt = random_tokens[i] if noise[i] else successors[tokens[i - 1], choice[i]]
        tokens[i] = nxt
    return tokens


class ShuffledWindowLoader:
    """Yields (inputs, targets) batches of non-overlapping windows in a seeded shuffled order.

    ``state_dict`` holds the epoch, the position within that epoch's permutation and the
    shuffle seed: the order is a pure function of (seed, epoch), so a restored loader yields
    exactly the batches the original would have. A position alone would not be enough.
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, batch_size: int, seed: int) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.num_windows = (len(tokens) - 1) // block_size
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_windows, generator=g)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.batch_size > self.num_windows:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        picks = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        starts = picks * self.block_size
        offsets = torch.arange(self.block_size + 1)
        windows = self.tokens[starts[:, None] + offsets[None, :]]
        return windows[:, :-1], windows[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_windows": self.num_windows,
            "batch_size": self.batch_size,
            "order_digest": xxhash.xxh3_64_hexdigest(self._order.numpy().tobytes()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_windows"] != self.num_windows or state["batch_size"] != self.batch_size:
            raise ValueError(
                f"loader state is for {state['num_windows']} windows in batches of {state['batch_size']}, "
                f"this loader has {self.num_windows} in batches of {self.batch_size}"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)
        digest = xxhash.xxh3_64_hexdigest(self._order.numpy().tobytes())
        if digest != state["order_digest"]:
            raise ValueError("restored shuffle order does not match the saved order digest")
