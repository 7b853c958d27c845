"""The demo run's configuration, recorded in the run directory as ``run.json``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from drill import safe_json
from drill.memory import physical_memory
from drill.units import human_bytes

RUN_FILE = "run.json"


@dataclass(kw_only=True, slots=True)
class DemoConfig:
    steps: int = 110
    """Optimizer steps to train. The run goes on past its last save, as real runs do, so the
    step log holds what happened after every retained checkpoint: the replay reference."""
    save_every: int = 20
    """Save a checkpoint every this many steps."""
    keep: int = 3
    """Keep-last-K retention: older checkpoints are deleted after each save."""
    seed: int = 1234
    vocab_size: int = 64
    block_size: int = 32
    """Context length in tokens."""
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.1
    """Dropout makes the run depend on its RNG state, which a resume must restore."""
    batch_size: int = 16
    corpus_tokens: int = 65_536
    """Length of the synthetic token stream."""
    lr: float = 3e-3
    warmup_steps: int = 10
    weight_decay: float = 0.01
    threads: int = 1
    """torch CPU threads; pinned so a replay can reproduce the run bit for bit."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("steps must be at least 1: a run that never steps saves nothing worth restoring")
        if self.save_every < 1:
            raise ValueError("save_every must be at least 1")
        if self.keep < 1:
            raise ValueError("keep must be at least 1: keep-last-0 would delete every checkpoint it writes")
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.save_every > self.steps:
            raise ValueError(f"the run would save no checkpoint: {self.steps} steps, a save every {self.save_every}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.corpus_tokens < (self.block_size + 1) * self.batch_size:
            raise ValueError("corpus_tokens is too small for one batch of block_size windows")
        if (need := self.training_bytes) > (have := physical_memory()):
            raise ValueError(
                f"{self.n_layer} blocks of width {self.n_embd} need about {human_bytes(need)} to train "
                f"(weights, gradients, Adam's two moments), more than this host's {human_bytes(have)} of memory"
            )

    @property
    def training_bytes(self) -> int:
        """What training the model holds at least: its fp32 parameters (≈ 12·layers·width² in the
        blocks, the embeddings beside them) four times — weights, gradients, Adam's moments."""
        params = 12 * self.n_layer * self.n_embd**2 + (self.vocab_size + self.block_size) * self.n_embd
        return 16 * params

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def write(self, run_dir: Path, device: str = "cpu", ranks: int = 1) -> None:
        doc = {
            "kind": "drill-demo",
            "config": self.to_dict(),
            "device": device,
            "ranks": ranks,
            # How drill replays this run: the entrypoint that rebuilds its training objects
            # (in a process group of its own when several ranks replay it).
            "replay": "drill.demo.replay:build_replay",
        }
        (run_dir / RUN_FILE).write_text(json.dumps(doc, indent=2) + "\n")

    @classmethod
    def read(cls, run_dir: str | Path) -> DemoConfig:
        """The configuration recorded in ``run_dir``: a local path or an ``s3://`` prefix."""
        from drill.runlog.runfiles import read_run_file

        doc = safe_json.loads(read_run_file(str(run_dir), RUN_FILE))
        return cls(**doc["config"])
