"""The device a drill restores onto: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

:func:`parse_device` checks the spelling without importing torch (policy files, flags before
any I/O); :func:`resolve_device` checks that this host has it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_DEVICE = re.compile(r"^(auto|cpu|cuda(?::(\d+))?)\Z")
FORMS = "auto, cpu, cuda or cuda:N"


def parse_device(spec: str) -> str:
    """The normalized spec; raises ``ValueError`` for anything but auto|cpu|cuda|cuda:N."""
    text = str(spec).strip().lower()
    if not _DEVICE.match(text):
        raise ValueError(f"unknown device {spec!r}: expected {FORMS}")
    return text


def resolve_device(spec: str) -> torch.device:
    """The ``torch.device`` for ``spec``; raises ``ValueError`` when this host lacks it."""
    import torch

    text = parse_device(spec)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device {text}: CUDA is not available on this host (use cpu or auto)")
    index = int(text.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {text}: this host has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(f"cuda:{index}")


def cuda_usable() -> bool:
    """Whether a CUDA device could be used here, without initializing CUDA when torch is absent."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
