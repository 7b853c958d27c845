"""Deterministic replay: resume a checkpoint in the real training objects and compare.

The protocol a user's trainer implements (see the README's worked example)::

    def build_replay(*, run_dir: str, checkpoint: str, device: torch.device) -> ReplayTarget

    class ReplayTarget(Protocol):
        threads: int | None              # torch CPU threads the original run used (optional)
        def stateful(self) -> dict[str, Stateful]   # model, optimizer, lr_scheduler, dataloader, rng, train_state
        def step(self) -> StepRecord                # one optimizer step: loss, grad_norm, batch fingerprint

drill loads the checkpoint into ``stateful()`` (with ``dcp.load`` through its safe reader),
switches on deterministic mode, calls ``step()`` K times in a child process under a
wall-clock timeout, and compares each step with the original run's record.
"""

from drill.replay.compare import Divergence, Tolerance, compare_steps
from drill.replay.reference import Reference, load_reference
from drill.replay.spec import ReplaySpec

__all__ = ["Divergence", "Reference", "ReplaySpec", "Tolerance", "compare_steps", "load_reference"]
