"""A small, genuine training run: drill's demo, its replay target and its test fixture.

``drill demo DIR`` trains a decoder-only transformer on a synthetic token stream and writes
DCP checkpoints ``step-N/`` the way torchtitan does. Tests build real checkpoints with it.
"""

from drill.demo.config import DemoConfig
from drill.demo.train import DemoRunResult, build, train

__all__ = ["DemoConfig", "DemoRunResult", "build", "train"]
