"""The run's dataset — the one thing a replay cannot take from the checkpoint. Here a synthetic
token dataset (no download); in a real fine-tune, the function that builds your train split."""

from __future__ import annotations

import torch


class TokenDataset(torch.utils.data.Dataset):
    """64 sequences of 16 token ids, each from a fixed seed: the same on every machine."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def train_dataset() -> TokenDataset:
    return TokenDataset()
