"""A Lightning run that drill can drill: 3 epochs of 8 steps, a checkpoint at the end of each
(``epoch=E-step=S.ckpt``), every step's loss in the CSV logger's ``metrics.csv``.

    python examples/lightning/train.py ./pl-run
    drill run --root ./pl-run --replay examples/lightning/replay.py:build_replay
"""

from __future__ import annotations

import argparse

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from model import Regression, train_loader  # a sibling file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=3)
    out = ap.parse_args()
    L.seed_everything(7)
    trainer = L.Trainer(
        max_epochs=out.epochs, accelerator="cpu", default_root_dir=out.root, logger=CSVLogger(out.root, name="logs"),
        log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=out.root, every_n_epochs=1, save_top_k=-1)],  # the run root holds the .ckpt files
    )  # fmt: skip
    trainer.fit(Regression(), train_loader())


if __name__ == "__main__":
    main()
