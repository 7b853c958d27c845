"""Checkpoints written by the real frameworks (and by the same code paths without them)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from drill.demo import DemoConfig
from drill.demo.train import build, deterministic, train_step

TINY = DemoConfig(steps=4, save_every=4, n_layer=1, n_embd=32, n_head=2, corpus_tokens=4096, batch_size=4)


class _TokenDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def hf_trainer_run(out: Path, *, finish: bool = False, callbacks: list | None = None) -> Path:
    """A tiny GPT-2 built from a config (no download), trained 4 steps by transformers' Trainer;
    ``finish``: then ``save_model()`` and ``save_state()``, as HF's example scripts end."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=4,
        save_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        seed=7,
        disable_tqdm=True,
        logging_steps=1,
    )
    trainer = Trainer(model=model, args=args, train_dataset=_TokenDataset(), callbacks=callbacks)
    trainer.train()
    if finish:
        trainer.save_model()
        trainer.save_state()
    return out


def hf_trainer_resume(out: Path, checkpoint: str) -> int:
    """Resume the run ``hf_trainer_run`` wrote from ``checkpoint`` with HF's own
    ``trainer.train(resume_from_checkpoint=...)``, two more steps; returns the global step."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=6,
        save_steps=100,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        seed=7,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=_TokenDataset())
    trainer.train(resume_from_checkpoint=checkpoint)
    return trainer.state.global_step


def lightning_run(out: Path) -> Path:
    """A tiny LightningModule trained 4 steps by lightning's Trainer; returns the .ckpt's directory."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self, lr: float = 0.01) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 2)}

    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    trainer = L.Trainer(
        max_steps=4,
        accelerator="cpu",
        default_root_dir=str(out),
        enable_progress_bar=False,
        logger=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4, shuffle=True))
    return out / "checkpoints"


def nanogpt_checkpoint(out: Path) -> Path:
    """A nanoGPT-style torch.save dict of the demo model after a few real training steps."""
    out.mkdir(parents=True, exist_ok=True)
    with deterministic(1):
        objs = build(TINY)
        for _ in range(TINY.steps):
            train_step(objs)
    path = out / "ckpt.pt"
    torch.save(
        {
            "model": objs.model.state_dict(),
            "optimizer": objs.optimizer.state_dict(),
            "model_args": {"n_layer": TINY.n_layer, "n_embd": TINY.n_embd},
            "iter_num": objs.train_state.step,
            "best_val_loss": 3.2,
        },
        path,
    )
    return path
