"""A real Lightning Trainer run with ``FSDPStrategy(state_dict_type="sharded")`` on CPU ranks.

Lightning's FSDP strategy wraps the module for a CUDA device; on CPU the only change made here
is a subclass that wraps it with ``device_id=cpu``. The save path — Lightning's own
``save_checkpoint`` writing a ``*.ckpt/`` directory of DCP shards plus ``meta.pt`` — is
unchanged. Run as ``python -m tests.support.lightning_fsdp OUT`` in each rank (torchrun-style env).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

STEPS = 4


def spawn(out: Path, ranks: int = 2, timeout: float = 300, *, seal: bool = False) -> Path:
    """Train and checkpoint with ``ranks`` CPU processes; returns the run's checkpoint directory.
    ``seal``: the strategy seals each checkpoint after saving it (drill.integrations.lightning)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(ranks),
        "PYTHONWARNINGS": "ignore",
    }
    if seal:
        env["DRILL_TEST_SEAL_AFTER_SAVE"] = "1"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.lightning_fsdp", str(out)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "NODE_RANK": "0"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
        )
        for r in range(ranks)
    ]  # fmt: skip
    outs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    if any(p.returncode for p in procs):
        tails = " | ".join(
            f"rank {r} exit {p.returncode}: {o[-1500:]}" for r, (p, o) in enumerate(zip(procs, outs, strict=True))
        )
        raise RuntimeError(f"Lightning FSDP run failed: {tails}")
    return out / "checkpoints"


def main(out: Path) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    from drill.integrations.lightning import SealAfterSave

    bases = (SealAfterSave, FSDPStrategy) if os.environ.get("DRILL_TEST_SEAL_AFTER_SAVE") else (FSDPStrategy,)

    class CPUFSDP(*bases):
        def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
            return FullyShardedDataParallel(
                module=model,
                device_id=torch.device("cpu"),
                use_orig_params=True,
                sharding_strategy=self.sharding_strategy,
            )

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 2)}

    L.seed_everything(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=CPUFSDP(state_dict_type="sharded", process_group_backend="gloo"),
        default_root_dir=str(out),
        callbacks=[ModelCheckpoint(dirpath=str(out / "checkpoints"), every_n_train_steps=2, save_top_k=-1)],
        enable_progress_bar=False,
        logger=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4, shuffle=True))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()  # every rank's shards and meta.pt are written
    import atexit

    atexit._run_exitfuncs()  # multiprocessing stops the workers a library started (Megatron does)
    sys.stdout.flush()
    # No interpreter teardown: gloo's threads torn down at exit can abort the process
    # ("terminate called without an active exception") after the checkpoint is complete.
    os._exit(0)
