"""``drill demo``: train a small real run to drill."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from drill.cli.common import DebugOption, JsonOption, print_json, stderr, stdout
from drill.errors import UsageError


def demo(
    directory: Annotated[Path, typer.Argument(help="New run directory to write (must be empty or absent).")],
    steps: Annotated[int, typer.Option(help="Optimizer steps to train (the run goes on past its last save).")] = 110,
    save_every: Annotated[int, typer.Option("--save-every", help="Save a DCP checkpoint every K steps.")] = 20,
    keep: Annotated[int, typer.Option(help="Keep the last L checkpoints (older ones are deleted).")] = 3,
    n_layer: Annotated[int, typer.Option("--n-layer", help="Transformer blocks.")] = 2,
    n_embd: Annotated[int, typer.Option("--n-embd", help="Embedding width (≈ 12·layers·width² parameters).")] = 64,
    ranks: Annotated[
        int, typer.Option("--ranks", help="Train with N CPU ranks (FSDP2, gloo): a genuinely sharded checkpoint.")
    ] = 1,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Train a small deterministic transformer and write a real run with DCP checkpoints.

    The run directory gets run.json (the configuration), drill-steps.jsonl (loss, grad norm
    and batch fingerprint per step) and step-N/ checkpoints holding model, optimizer, LR
    scheduler, data loader, RNG and train state. With --ranks N, N processes train it with
    the model and optimizer sharded (FSDP2) and save per-rank RNG and data-loader state.

    Example: drill demo ./demo-run --steps 100 --save-every 20 --keep 3
    """
    from drill.demo import DemoConfig, train

    try:
        cfg = DemoConfig(steps=steps, save_every=save_every, keep=keep, n_layer=n_layer, n_embd=n_embd)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(f"{directory} exists and is not an empty directory; the demo writes a fresh run")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {directory}: {exc.strerror or exc}") from None
    if ranks != 1:
        return _demo_ranks(directory, cfg, ranks, json=json)
    with stderr().status("training", spinner="dots") as status:
        result = train(
            directory, cfg, on_step=lambda r: status.update(f"training: step {r.step}/{cfg.steps}, loss {r.loss:.4f}")
        )
    doc: dict[str, Any] = {
        "run_dir": str(directory.resolve()),
        "steps": cfg.steps,
        "seconds": result.seconds,
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
        "saved": result.saved,
        "retained": [f"step-{s}" for s in result.retained],
    }
    if json:
        print_json(doc)
        return
    out = stdout()
    out.print(
        f"trained {cfg.steps} steps in {result.seconds:.1f} s: loss {doc['first_loss']:.4f} → {doc['last_loss']:.4f}",
        markup=False,
    )
    out.print(f"retained checkpoints: {', '.join(doc['retained'])} in {doc['run_dir']}", markup=False)
    out.print(f"next: drill run --root {directory} --checkpoint latest", markup=False, style="dim")


def _demo_ranks(directory: Path, cfg: object, ranks: int, *, json: bool) -> None:
    from drill.checkpoints import step_of
    from drill.demo.distributed import train_distributed
    from drill.runlog import read_step_log

    if not 2 <= ranks <= 64:
        raise UsageError(f"--ranks must be between 2 and 64, not {ranks}")
    with stderr().status(f"training on {ranks} ranks", spinner="dots"):
        try:
            seconds = train_distributed(directory, cfg, ranks)  # type: ignore[arg-type]
        except RuntimeError as exc:
            raise UsageError(f"the {ranks}-rank demo failed: {exc}") from None
    log = read_step_log(directory)
    retained = sorted((p.name for p in directory.iterdir() if p.is_dir() and step_of(p.name) is not None), key=step_of)  # type: ignore[arg-type]
    doc = {
        "run_dir": str(directory.resolve()),
        "ranks": ranks,
        "steps": len(log),
        "seconds": seconds,
        "first_loss": log[0].loss,
        "last_loss": log[-1].loss,
        "retained": retained,
    }
    if json:
        print_json(doc)
        return
    out = stdout()
    out.print(
        f"trained {len(log)} steps on {ranks} ranks in {seconds:.1f} s: loss {log[0].loss:.4f} → {log[-1].loss:.4f}",
        markup=False,
    )
    out.print(f"retained sharded checkpoints: {', '.join(retained)} in {doc['run_dir']}", markup=False)
    out.print(
        f"next: drill run --root {directory} --checkpoint latest   (or under torchrun/srun, one rank per process)",
        markup=False,
        style="dim",
    )
