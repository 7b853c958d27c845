"""``drill demo``: train a small real run to drill."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Train a small deterministic transformer and write a real run with DCP checkpoints.

    The run directory gets run.json (the configuration), drill-steps.jsonl (loss, grad norm
    and batch fingerprint per step) and step-N/ checkpoints holding model, optimizer, LR
    scheduler, data loader, RNG and train state.

    Example: drill demo ./demo-run --steps 100 --save-every 20 --keep 3
    """
    from drill.demo import DemoConfig, train

    try:
        cfg = DemoConfig(steps=steps, save_every=save_every, keep=keep, n_layer=n_layer, n_embd=n_embd)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(f"{directory} exists and is not an empty directory; the demo writes a fresh run")
    with stderr().status("training", spinner="dots") as status:
        result = train(directory, cfg, on_step=lambda r: status.update(f"training: step {r.step}/{cfg.steps}, loss {r.loss:.4f}"))
    doc = {
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
    out.print(f"trained {cfg.steps} steps in {result.seconds:.1f} s: loss {doc['first_loss']:.4f} → {doc['last_loss']:.4f}", markup=False)
    out.print(f"retained checkpoints: {', '.join(doc['retained'])} in {doc['run_dir']}", markup=False)
    out.print(f"next: drill run --root {directory} --checkpoint latest", markup=False, style="dim")
