"""Checkpoints in the layouts big runs use, written for real by 1 or 2 CPU ranks.

- ``megatron``: Megatron-core's own ``dist_checkpointing.save`` (torch_dist backend) of a
  tensor-parallel GPT-shaped state laid out as Megatron-LM's training loop lays it out:
  ``iter_0000030/`` (``.metadata``, ``__R_T.distcp``, ``common.pt``, ``metadata.json``) and
  ``latest_checkpointed_iteration.txt``; model and optimizer keys, RNG as ShardedObjects,
  iteration, args and scheduler in ``common.pt``.
- ``torchtitan``: torchtitan 0.3's layout, from its checkpointer's source — model state flattened
  to the top level beside ``optimizer`` (``state.<fqn>.<slot>``, ``param_groups.<fqn>.<key>``),
  ``lr_scheduler`` (``last_epoch``), ``dataloader`` (``dp_rank_N``: pickled loader state) and
  ``train_state``; no RNG — with FSDP2-sharded state.
- ``lightning``: Lightning's ``FSDPStrategy(state_dict_type="sharded")`` layout, from its
  source — ``<name>.ckpt/`` holding DCP shards of ``model`` and ``optimizer_0`` and ``meta.pt``
  (loops, schedulers, step) — with a persisted causal mask of ``-inf``.

Run as ``python -m tests.support.layouts KIND DIR [NAN_DIR]`` in each rank (RANK, WORLD_SIZE,
DRILL_DIST_INIT); with NAN_DIR the same ranks write the copy with a NaN there too.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STEP = 30


NAN_IN = {
    "torchtitan": "blocks.0.attn.qkv.weight",
    "lightning": "model.blocks.0.attn.qkv.weight",
    "megatron": "decoder.layers.mlp.linear_fc1.weight",
}
"""The weight the copy ``spawn(..., nan_out=DIR)`` writes holds a NaN in (rank 0's shard), per layout."""


def spawn(kind: str, out: Path, ranks: int, timeout: float = 300, nan_out: Path | None = None) -> Path:
    """Write a ``kind`` checkpoint under ``out`` with ``ranks`` processes — and with
    ``nan_out``, the same ranks then write a second run there whose weight :data:`NAN_IN`
    names holds one NaN (the writers' start-up, most of a spawn's time, paid once)."""
    for where in (out, nan_out):
        if where is not None:
            where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as rdzv:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.layouts", kind, str(out), *([str(nan_out)] if nan_out else [])],
                env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(ranks), "DRILL_DIST_INIT": f"file://{rdzv}/s"},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
            )
            for r in range(ranks)
        ]  # fmt: skip
        outs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{kind} writer failed: {outs[0][-2000:]} {outs[-1][-2000:]}")
    return out


def _model_and_step(world: int) -> tuple[Any, Any, Any]:
    """An FSDP2-sharded demo transformer after one AdamW step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from drill.demo.config import DemoConfig
    from drill.demo.model import TinyGPT

    torch.manual_seed(0)
    cfg = DemoConfig(dropout=0.0)
    model = TinyGPT(cfg)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.block_size))
    for _ in range(2):
        model(x, x).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


def _runs(outs: list[Path]) -> list[tuple[Path, bool]]:
    """Where to save, and whether that copy is the one with a NaN (the second, if asked)."""
    return list(zip(outs, (False, True), strict=False))


def _poison(state: dict[str, Any], key: str, rank: int) -> None:
    """One NaN in ``state[key]`` (rank 0's local shard)."""
    if rank == 0:
        t = state[key]
        local = t.to_local() if hasattr(t, "to_local") else t
        with torch.no_grad():
            local.view(-1)[0] = float("nan")


def torchtitan(outs: list[Path], rank: int, world: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model, opt, sched = _model_and_step(world)
    osd = get_optimizer_state_dict(model, opt)
    flat: dict[str, Any] = {}
    for fqn, slots in osd["state"].items():
        for slot, value in slots.items():
            flat[f"state.{fqn}.{slot}"] = value
    for group in osd["param_groups"]:
        for fqn in group["params"]:
            for k, v in group.items():
                if k != "params":
                    flat[f"param_groups.{fqn}.{k}"] = v
    loader = {"_num_yielded": 2, "_sampler_iter_yielded": 2, "dataset_state": {"sample_idx": 2 * 4 * (rank + 1)}}
    state = {
        **get_model_state_dict(model),  # torchtitan flattens the model to the top level
        "optimizer": flat,
        "lr_scheduler": {"last_epoch": 2},
        "dataloader": {f"dp_rank_{rank}": pickle.dumps(loader), "world_size": world},
        "train_state": {"step": 2, "ntokens_seen": 2 * 4 * 32 * world},
    }
    for out, nan in _runs(outs):
        if nan:
            _poison(state, NAN_IN["torchtitan"], rank)
        dcp.save(state, checkpoint_id=str(out / "step-2"))


def lightning(outs: list[Path], rank: int, world: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model, opt, sched = _model_and_step(world)
    inner = get_model_state_dict(model)
    mask = torch.triu(torch.full((32, 32), float("-inf")), diagonal=1)  # an nn.Transformer-style causal mask, persisted
    converted = {"model": {**{f"model.{k}": v for k, v in inner.items()}, "causal_mask": mask}}
    osd = get_optimizer_state_dict(model, opt)
    converted["optimizer_0"] = {
        "state": {f"model.{k}": v for k, v in osd["state"].items()},
        "param_groups": [{**g, "params": [f"model.{p}" for p in g["params"]]} for g in osd["param_groups"]],
    }
    for out, nan in _runs(outs):
        if nan:
            _poison(converted["model"], NAN_IN["lightning"], rank)
        path = out / "epoch=0-step=2.ckpt"
        dcp.save(converted, checkpoint_id=str(path))
        if rank == 0:
            meta = {
                "epoch": 0,
                "global_step": 2,
                "pytorch-lightning_version": "2.6.0",
                "loops": {"fit_loop": {"state_dict": {}, "epoch_loop.state_dict": {"_batches_that_stepped": 2},
                                       "epoch_loop.batch_progress": {"total": {"ready": 2, "started": 2, "processed": 2, "completed": 2},
                                                                     "current": {"ready": 2, "started": 2, "processed": 2, "completed": 2}, "is_last_batch": False}}},
                "callbacks": {},
                "optimizer_states": [],
                "lr_schedulers": [sched.state_dict()],
                "hparams_name": "kwargs",
                "hyper_parameters": {"lr": 1e-3},
            }  # fmt: skip
            torch.save(meta, path / "meta.pt")


def megatron(outs: list[Path], rank: int, world: int) -> None:
    from megatron.core import dist_checkpointing

    torch.cuda.synchronize = lambda *a, **k: None  # CPU shims: Megatron's save syncs CUDA and puts its
    torch.cuda.current_device = lambda: "cpu"  # failure flag on the current CUDA device unconditionally
    torch.manual_seed(rank)
    tp, layers, hidden, vocab = world, 2, 64, 128
    params = {
        "embedding.word_embeddings.weight": (torch.randn(vocab // tp, hidden), 0, False),
        "decoder.layers.self_attention.linear_qkv.weight": (torch.randn(layers, 3 * hidden // tp, hidden), 0, True),
        "decoder.layers.self_attention.linear_proj.weight": (torch.randn(layers, hidden, hidden // tp), 1, True),
        "decoder.layers.mlp.linear_fc1.weight": (torch.randn(layers, 4 * hidden // tp, hidden), 0, True),
        "decoder.layers.mlp.linear_fc2.weight": (torch.randn(layers, hidden, 4 * hidden // tp), 1, True),
        "decoder.final_layernorm.weight": (torch.ones(hidden), None, False),
        "output_layer.weight": (torch.randn(vocab // tp, hidden), 0, False),
    }
    for out, nan in _runs(outs):
        if nan:
            _poison({k: v[0] for k, v in params.items()}, NAN_IN["megatron"], rank)
        sd = _megatron_state(params, rank, tp, layers, hidden)
        path = out / f"iter_{STEP:07d}"
        path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save(sd, str(path))
        dist.barrier()
        if rank == 0:
            (out / "latest_checkpointed_iteration.txt").write_text(str(STEP))


def _megatron_state(params: dict[str, Any], rank: int, tp: int, layers: int, hidden: int) -> dict[str, Any]:
    """The sharded state dict Megatron-LM's training loop saves, of ``params`` (each its
    local shard, the axis it is split on and whether its layers are stacked)."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    def tensor(key: str, local: torch.Tensor, axis: int | None, stacked: bool = False) -> ShardedTensor:
        offsets = [] if axis is None else [(axis + (1 if stacked else 0), rank, tp)]
        if stacked:
            offsets = [(0, 0, 1), *offsets]
        return ShardedTensor.from_rank_offsets(
            key, local, *offsets, replica_id=0 if axis is not None or rank == 0 else rank
        )

    sd: dict[str, Any] = {"model": {}, "optimizer": {"state": {}}}
    for key, (local, axis, stacked) in params.items():
        sd["model"][key] = tensor(key, local, axis, stacked)
        for slot in ("exp_avg", "exp_avg_sq", "fp32_param"):
            value = local.clone() if slot == "fp32_param" else torch.randn_like(local).abs() * 1e-3
            sd["optimizer"]["state"].setdefault(slot, {})[key] = tensor(
                f"optimizer.state.{slot}.{key}", value, axis, stacked
            )
    group = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "step": STEP}
    sd["optimizer"]["param_groups"] = [{**group, "params": list(range(len(params)))}]
    rng = {
        "random_rng_state": __import__("random").getstate(),
        "np_rng_state": __import__("numpy").random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": None,
        "rng_tracker_states": {},
    }
    sd["rng_state"] = ShardedObject("rng_state", [rng], (1, tp), (0, rank), replica_id=0)
    scheduler = {"max_lr": 3e-4, "min_lr": 3e-5, "num_steps": STEP * 8, "warmup_steps": 10, "decay_style": "cosine"}
    sd.update(
        args=argparse.Namespace(
            num_layers=layers, hidden_size=hidden, tensor_model_parallel_size=tp, lr=3e-4, no_save_rng=False
        ),
        checkpoint_version=3.0,
        iteration=STEP,
        opt_param_scheduler=scheduler,
        num_floating_point_operations_so_far=0,
    )
    return sd


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    kind, where = sys.argv[1], [Path(p) for p in sys.argv[2:]]
    r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["DRILL_DIST_INIT"], rank=r, world_size=w)
    try:
        {"torchtitan": torchtitan, "lightning": lightning, "megatron": megatron}[kind](where, r, w)
        dist.barrier()  # every rank's part of the checkpoint is written
    except BaseException:
        dist.destroy_process_group()
        raise
    import atexit

    atexit._run_exitfuncs()  # multiprocessing stops the workers a library started (Megatron does)
    sys.stdout.flush()
    # No interpreter teardown: gloo's threads torn down at exit can abort the process
    # ("terminate called without an active exception") after the checkpoint is complete.
    os._exit(0)
