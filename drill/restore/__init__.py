"""Restoring a checkpoint: every file read, every tensor loaded onto the target device.

A restore never stops at the first problem: it records what it could not read or load, so
the checks can name every missing file and every key a resume would lose.
"""

from drill.restore.progress import NullProgress, Progress
from drill.restore.result import FileRead, HashPlan, ItemFailure, RestoreResult

__all__ = ["FileRead", "HashPlan", "ItemFailure", "NullProgress", "Progress", "RestoreResult"]
