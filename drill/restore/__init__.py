"""What a restore produced: every file read, every entry loaded or why not, and how long.

A restore never stops at the first problem: it records what it could not read or load, so
the checks can name every missing file and every key a resume would lose. The format
adapters in :mod:`drill.formats` fill it in.
"""

from drill.restore.progress import NullProgress, Progress
from drill.restore.result import FileRead, ItemFailure, RestoreResult, TensorInfo

__all__ = ["FileRead", "ItemFailure", "NullProgress", "Progress", "RestoreResult", "TensorInfo"]
