"""Checkpoints written by the libraries' own save code, on CPU (2 ranks where the library shards).

- ``deepspeed-zero1`` / ``-zero2`` / ``-zero3``: DeepSpeed's ``engine.save_checkpoint`` after 3
  AdamW steps with a WarmupLR schedule on 2 data-parallel ranks (``latest`` + ``global_step3/``).
- ``hf-deepspeed``: transformers' ``Trainer`` with DeepSpeed ZeRO-2 (``checkpoint-N/`` holding
  DeepSpeed's ``global_stepN/`` with the optimizer and scheduler), 1 process.
- ``accelerate``: ``Accelerator.save_state`` with automatic checkpoint naming, a stateful data
  loader (torchdata), a scheduler and a registered step counter (``checkpoints/checkpoint_0/``).
- ``accelerate-fsdp``: the same on 2 ranks with FSDP2's sharded state dict
  (``pytorch_model_fsdp_0/``, ``optimizer_0/``: DCP directories inside the save).
- ``torchsnapshot``: ``Snapshot.take`` of model, optimizer, progress and RNG (``step-3/``).
- ``torchtune``: torchtune's ``FullModelHFCheckpointer.save_checkpoint`` as its
  ``full_finetune_single_device`` recipe calls it after epochs 0 and 1 of 3 (``epoch_0/``,
  ``epoch_1/``, ``recipe_state/recipe_state.pt``), a tiny Llama trained by torchtune's model.
- ``dcp-app``: the DCP tutorial's ``{"app": AppState}`` (``step-3/``).
- ``dcp-hf``: ``dcp.save`` through ``HuggingFaceStorageWriter`` (safetensors, ``step-3/``).

Run as ``python -m tests.support.writers KIND DIR`` in each rank (RANK, WORLD_SIZE, WRITER_INIT).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RANKS = {
    "hf-deepspeed": 1,
    "deepspeed-zero1": 2,
    "deepspeed-zero2": 2,
    "deepspeed-zero3": 2,
    "accelerate": 1,
    "accelerate-fsdp": 2,
    "torchsnapshot": 1,
    "torchtune": 1,
    "torchtune-lora": 1,
    "lightning-deepspeed": 2,
    "composer": 1,
    "composer-sharded": 2,
    "dcp-app": 1,
    "dcp-hf": 1,
}
NEEDS = {
    "hf": "transformers",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "torchsnapshot": "torchsnapshot",
    "torchtune": "torchtune",
    "composer": "composer",
    "lightning": "deepspeed",
}
"""Writer prefix → the module it needs (its tests skip where it does not install)."""
APART = Path(__file__).resolve().parents[2] / ".writers"
"""Where trainers whose pins exclude this torch are installed, seen by their writer processes
only (tests/writers-no-deps.txt)."""
INSTALLED_APART = ("composer",)


def missing(kind: str) -> str | None:
    """Why the library a ``kind`` writer needs is not here (None: it is)."""
    import importlib.util

    prefix = kind.split("-")[0]
    module = NEEDS.get(prefix)
    if module is None:
        return None
    if prefix in INSTALLED_APART:
        found = (APART / module).is_dir()
        how = f"install it apart: pip install --no-deps --target {APART.name} -r tests/writers-no-deps.txt"
    else:
        found, how = importlib.util.find_spec(module) is not None, "it does not install here"
    return None if found else f"{module} is not installed ({how}): no real checkpoint of it to drill"


def spawn(kind: str, out: Path, timeout: float = 600) -> Path:
    """Write a ``kind`` checkpoint run under ``out`` with its library, in as many processes as it shards over."""
    out.mkdir(parents=True, exist_ok=True)
    ranks = RANKS[kind]
    with tempfile.TemporaryDirectory() as rdzv:
        env = {
            **os.environ,
            "WORLD_SIZE": str(ranks),
            "WRITER_INIT": f"file://{rdzv}/s",
            "DS_ACCELERATOR": "cpu",
            "CUDA_VISIBLE_DEVICES": "",
            "HF_HUB_OFFLINE": "1",
            "WRITER_PORT": str(_free_port()),
        }
        if kind.split("-")[0] in INSTALLED_APART:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APART), env.get("PYTHONPATH")]))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.writers", kind, str(out)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
            )
            for r in range(ranks)
        ]  # fmt: skip
        outs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{kind} writer failed: {outs[0][-3000:]} {outs[-1][-1500:]}")
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batches(n: int, seed: int = 1) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(n)]


def _init() -> tuple[int, int]:
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", init_method=os.environ["WRITER_INIT"], rank=rank, world_size=world)
    return rank, world


def _done() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# -- DeepSpeed ---------------------------------------------------------------------------------
def _no_shm_build() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory collectives (a speed-up over gloo that
    takes a fresh machine a minute of gcc, not needed here). The module is taken from
    ``sys.modules``: ``import deepspeed.comm.torch as m`` binds ``deepspeed.comm``'s attribute
    ``torch`` — torch itself, re-exported there — so patching that would patch nothing."""
    import importlib

    backend = importlib.import_module("deepspeed.comm.torch")
    if hasattr(backend, "build_shm_op"):
        backend.build_shm_op = lambda *a, **k: None


def deepspeed(stage: int, out: Path) -> None:
    import deepspeed as ds
    import torch

    _no_shm_build()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ds.init_distributed(
        dist_backend="gloo",
        auto_mpi_discovery=False,
        init_method=os.environ["WRITER_INIT"],
        rank=rank,
        world_size=world,
    )
    model = _model()
    config = {
        "train_batch_size": 4 * world,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        "zero_optimization": {"stage": stage},
    }
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)
    for x, y in _batches(3, seed=1 + rank):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out), client_state={"epoch": 0})
    _done()


def hf_deepspeed(out: Path) -> None:
    import deepspeed as ds

    _no_shm_build()
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="1", ACCELERATE_USE_DEEPSPEED="true"
    )  # read, never dialled: the group is up
    ds.init_distributed(
        dist_backend="gloo", auto_mpi_discovery=False, init_method=os.environ["WRITER_INIT"], rank=0, world_size=1
    )
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from tests.support.frameworks import _TokenDataset

    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
              "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}}}  # fmt: skip
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
        deepspeed=config,
    )
    Trainer(model=model, args=args, train_dataset=_TokenDataset()).train()
    _done()


# -- accelerate --------------------------------------------------------------------------------
class Counter:
    """A training-step counter registered for checkpointing, as accelerate's examples do."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def accelerate(out: Path, fsdp: bool) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

    rank, world = _init()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # read by accelerate's checks only: the group is already up
    os.environ.setdefault("MASTER_PORT", "1")
    kwargs: dict[str, Any] = {}
    if fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2, state_dict_type="SHARDED_STATE_DICT", cpu_ram_efficient_loading=False
        )
    acc = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=str(out), automatic_checkpoint_naming=True),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
        **kwargs,
    )
    if fsdp:  # accelerate enables FSDP for accelerator-backed runs only; its save code is the same on CPU
        from accelerate.state import AcceleratorState, PartialState
        from accelerate.utils import DistributedType

        for state in (PartialState(), AcceleratorState()):
            state.distributed_type = DistributedType.FSDP
        AcceleratorState().fsdp_plugin = kwargs["fsdp_plugin"]
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 8, generator=torch.Generator().manual_seed(3)),
        torch.randn(64, 4, generator=torch.Generator().manual_seed(4)),
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    for i, (x, y) in enumerate(loader):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        sched.step()
        counter.step += 1
        if i == 2:
            break
    acc.save_state()
    _done()


# -- torchsnapshot -----------------------------------------------------------------------------
def torchsnapshot(out: Path) -> None:
    import torch
    import torchsnapshot as ts

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    for x, y in _batches(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    progress = ts.StateDict(step=3, epoch=0)
    app = {"model": model, "optim": opt, "lr_scheduler": sched, "progress": progress, "rng": ts.RNGState()}
    ts.Snapshot.take(path=str(out / "step-3"), app_state=app)


# -- torchtune ---------------------------------------------------------------------------------
TUNE = {"vocab_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "embed_dim": 32, "max_seq_len": 16}


def torchtune(out: Path, epochs_saved: int = 2, lora: bool = False) -> None:
    """``full_finetune_single_device``'s training state saved as the recipe saves it: the model
    through torchtune's HF checkpointer after every epoch, with the recipe state (optimizer,
    seed, epochs run, the stateful loader) while epochs remain. ``lora``: as
    ``lora_finetune_single_device`` saves it — LoRA on q/v projections, base weights frozen,
    the optimizer over every parameter (state only for the adapters), the merged weights, the
    adapter (``adapter_model.pt``, PEFT's ``adapter_model.safetensors``) and its config."""
    import json

    import torch
    from safetensors.torch import save_file
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler
    from torchtune import training
    from torchtune.models import convert_weights
    from torchtune.models.llama3 import llama3, lora_llama3
    from torchtune.modules import peft
    from torchtune.training.checkpointing import FullModelHFCheckpointer

    torch.manual_seed(0)
    model = llama3(**TUNE)
    base = out / "base"
    base.mkdir(parents=True)
    config = {
        "num_attention_heads": TUNE["num_heads"],
        "num_key_value_heads": TUNE["num_kv_heads"],
        "hidden_size": TUNE["embed_dim"],
        "model_type": "llama",
    }
    (base / "config.json").write_text(json.dumps(config))
    hf = convert_weights.tune_to_hf(
        model.state_dict(), num_heads=TUNE["num_heads"], num_kv_heads=TUNE["num_kv_heads"], dim=TUNE["embed_dim"]
    )
    save_file({k: v.contiguous() for k, v in hf.items()}, str(base / "model.safetensors"))
    ckpt = FullModelHFCheckpointer(
        checkpoint_dir=str(base),
        checkpoint_files=["model.safetensors"],
        model_type="LLAMA3",
        output_dir=str(out / "output"),
    )
    if lora:
        model = lora_llama3(lora_attn_modules=["q_proj", "v_proj"], lora_rank=4, lora_alpha=8.0, **TUNE)
        model.load_state_dict(ckpt.load_checkpoint()[training.MODEL_KEY], strict=False)
        peft.set_trainable_params(model, peft.get_adapter_params(model))
    else:
        model.load_state_dict(ckpt.load_checkpoint()[training.MODEL_KEY])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, TUNE["vocab_size"], (24, TUNE["max_seq_len"]), generator=torch.Generator().manual_seed(5))
    sampler = StatefulDistributedSampler(tokens, num_replicas=1, rank=0, shuffle=True, seed=11)
    loader = StatefulDataLoader(tokens, batch_size=4, sampler=sampler, drop_last=True)
    total_epochs = 3
    for epoch in range(epochs_saved):
        sampler.set_epoch(epoch)
        for batch in loader:
            logits = model(batch)
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, TUNE["vocab_size"]), batch[:, 1:].reshape(-1)
            )
            loss.backward()
            opt.step()
            opt.zero_grad()
        state = _tune_weights(model, lora)
        if epoch + 1 < total_epochs:  # the recipe's save_checkpoint: recipe state while epochs remain
            state.update({training.SEED_KEY: 11, training.EPOCHS_KEY: epoch + 1, training.TOTAL_EPOCHS_KEY: total_epochs,
                          training.MAX_STEPS_KEY: None, training.DATALOADER_KEY: loader.state_dict(), training.OPT_KEY: opt.state_dict()})  # fmt: skip
        ckpt.save_checkpoint(state, epoch=epoch, intermediate_checkpoint=epoch + 1 < total_epochs)


def _tune_weights(model: Any, lora: bool) -> dict[str, Any]:
    """What a torchtune recipe hands its checkpointer as weights (LoRA: merged, the adapter and its config)."""
    from torchtune import training
    from torchtune.modules import peft

    if not lora:
        return {training.MODEL_KEY: model.state_dict()}
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    return {
        training.ADAPTER_KEY: peft.get_adapter_state_dict(state),
        training.MODEL_KEY: peft.get_merged_lora_ckpt(dict(state), rank=4, alpha=8.0),
        training.ADAPTER_CONFIG: {
            "r": 4,
            "lora_alpha": 8.0,
            "target_modules": ["q_proj", "v_proj"],
            "peft_type": "LORA",
        },
    }


# -- Lightning with DeepSpeed ------------------------------------------------------------------
def lightning_deepspeed(out: Path) -> None:
    """Lightning's ``Trainer`` with its ``DeepSpeedStrategy`` (ZeRO-2, 2 ranks), checkpointing
    every 4 steps over 2 epochs: ``epoch=E-step=S.ckpt/`` directories holding DeepSpeed's
    checkpoint (tag ``checkpoint``) with Lightning's loops, schedulers and counters in its client
    state, and a ``last.ckpt`` link. Lightning's strategy is CUDA-only in three checks; the
    subclass below passes them on CPU (../shared/ENGINES.md), its save code untouched."""
    import lightning.pytorch as pl
    import torch
    from lightning.fabric.utilities.seed import reset_seed
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
    from torch.utils.data import DataLoader, TensorDataset

    _no_shm_build()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["WRITER_PORT"], NODE_RANK="0")

    class CPUDeepSpeed(DeepSpeedStrategy):
        def setup_environment(self) -> None:
            DDPStrategy.setup_environment(self)  # DeepSpeedStrategy's refuses a CPU accelerator first

        def setup_distributed(self) -> None:
            import deepspeed as ds

            reset_seed()
            self.set_world_ranks()
            self._process_group_backend = "gloo"
            ds.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, init_method=os.environ["WRITER_INIT"],
                                rank=self.global_rank, world_size=self.world_size)  # fmt: skip

        @property
        def root_device(self) -> torch.device:
            return torch.device("cpu", 0)  # deepspeed.initialize is given its index

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def training_step(self, batch: Any, _: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            return {
                "optimizer": opt,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2), "interval": "step"},
            }

    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=CPUDeepSpeed(stage=2), max_epochs=2, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(out),
        callbacks=[ModelCheckpoint(dirpath=str(out), every_n_train_steps=4, save_top_k=-1, save_last="link")],
    )  # fmt: skip
    torch.manual_seed(0)
    trainer.fit(Module(), DataLoader(data, batch_size=4, shuffle=True))


# -- MosaicML Composer ------------------------------------------------------------------------
def _composer_import() -> Any:
    """Composer imports torchvision, whose registry wheels are CUDA builds that register fake
    kernels for two operators they never define on a CPU torch: define them (../shared/ENGINES.md)."""
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018 - defined by a working torchvision
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - kept alive below
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _composer_import.lib = lib  # type: ignore[attr-defined]
    import composer

    return composer


def composer(out: Path, sharded: bool) -> None:
    """Composer's ``Trainer`` saving every 4 batches over 2 epochs of 8 (``ep{e}-ba{b}-rank{r}.pt``
    and the ``latest-rank{r}.pt`` link autoresume follows); ``sharded``: FSDP2 with a sharded
    state dict on 2 ranks (``ep{e}-ba{b}/`` DCP directories)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    _composer_import()
    from composer import Trainer
    from composer.models import ComposerClassifier

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.update(LOCAL_WORLD_SIZE=str(world), NODE_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("WRITER_PORT", "29511"))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=8 // world, sampler=sampler)
    kwargs: dict[str, Any] = {}
    if sharded:
        from composer.utils.parallelism import FSDP2Config

        kwargs["parallelism_config"] = {"fsdp": FSDP2Config(state_dict_type="sharded")}
        kwargs["save_filename"] = "ep{epoch}-ba{batch}"
        # The link keeps its default per-rank name: with one name for all ranks, every rank
        # removes it and only rank 0 makes it again, so whether it survives is a race.
    model = ComposerClassifier(net, num_classes=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    Trainer(
        model=model, train_dataloader=loader, max_duration="2ep", optimizers=opt,
        schedulers=torch.optim.lr_scheduler.StepLR(opt, 4), save_folder=str(out), save_interval="4ba",
        device="cpu", seed=7, progress_bar=False, log_to_console=False, loggers=[], **kwargs,
    ).fit()  # fmt: skip


# -- DCP's own variants ------------------------------------------------------------------------
class AppState:
    """The DCP tutorial's ``Stateful`` wrapping model and optimizer (``{"app": AppState(...)}``)."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def dcp_app(out: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in _batches(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    dcp.save({"app": AppState(model, opt)}, checkpoint_id=str(out / "step-3"), no_dist=True)


def dcp_hf(out: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in _batches(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    dcp.save(model.state_dict(), storage_writer=HuggingFaceStorageWriter(path=str(out / "step-3")), no_dist=True)


def main(kind: str, out: Path) -> None:
    if kind == "hf-deepspeed":
        hf_deepspeed(out)
    elif kind.startswith("deepspeed-zero"):
        deepspeed(int(kind[-1]), out)
    elif kind in ("accelerate", "accelerate-fsdp"):
        accelerate(out, fsdp=kind.endswith("fsdp"))
    elif kind == "torchsnapshot":
        torchsnapshot(out)
    elif kind in ("torchtune", "torchtune-lora"):
        torchtune(out, lora=kind.endswith("lora"))
    elif kind == "lightning-deepspeed":
        lightning_deepspeed(out)
    elif kind in ("composer", "composer-sharded"):
        composer(out, sharded=kind.endswith("sharded"))
    elif kind == "dcp-app":
        dcp_app(out)
    elif kind == "dcp-hf":
        dcp_hf(out)
    else:
        raise SystemExit(f"unknown writer {kind}")


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    main(sys.argv[1], Path(sys.argv[2]))
    # The save is complete and its files closed: leave without the interpreter's teardown, where
    # a library's native threads have ended a finished writer in "terminate called without an
    # active exception" (seen once with the HF DeepSpeed writer).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
