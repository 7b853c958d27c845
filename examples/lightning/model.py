"""The run's LightningModule and its data — the code a replay cannot take from a checkpoint."""

from __future__ import annotations

import lightning as L
import torch


class Regression(L.LightningModule):
    """A small regression net: every step's loss logged (``train_loss``), as the replay compares."""

    def __init__(self, lr: float = 0.01, hidden: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 4)}


def train_loader() -> torch.utils.data.DataLoader:
    """32 samples from a fixed seed, in order: 8 steps an epoch."""
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4)
