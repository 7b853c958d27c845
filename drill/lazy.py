"""A package's names loaded from their modules when first asked for (PEP 562), so importing the
package costs only what its caller uses: ``drill`` without the pipeline, ``drill.sdk`` without
torch, ``drill.pipeline`` without a drill's request and replay for a reader of outcomes."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each of ``names`` (name → the module that
    defines it) imported on first use; any other name is an AttributeError, as without one."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__


__all__ = ["lazy_names"]
