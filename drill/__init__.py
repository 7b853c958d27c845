"""drill: restore drills and integrity audits for PyTorch training checkpoints.

The library is the product; ``drill.cli`` is a thin skin over it::

    from drill import run_drill, DrillRequest, DrillOutcome, verify_checkpoint, seal

Importing this package is cheap on purpose (no torch, SQLAlchemy or boto3): the names above
are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drill.lazy import lazy_names

__version__ = "0.5.0"

_EXPORTS = {
    "run_drill": "drill.api",
    "run_policy": "drill.api",
    "history": "drill.api",
    "get_drill": "drill.api",
    "last_good": "drill.api",
    "verify_audit_chain": "drill.api",
    "build_report": "drill.report",
    "ReportOptions": "drill.report",
    "DrillRequest": "drill.pipeline.request",
    "DrillOutcome": "drill.pipeline.outcome",
    "DrillStatus": "drill.verdict",
    "ExitCode": "drill.errors",
    "verify_checkpoint": "drill.verifier",
    "seal": "drill.verifier",
}

if TYPE_CHECKING:
    from drill.api import get_drill, history, last_good, run_drill, run_policy, verify_audit_chain
    from drill.errors import ExitCode
    from drill.pipeline.outcome import DrillOutcome
    from drill.pipeline.request import DrillRequest
    from drill.report import ReportOptions, build_report
    from drill.verdict import DrillStatus
    from drill.verifier import seal, verify_checkpoint


__getattr__ = lazy_names(__name__, _EXPORTS)


__all__ = [  # the names of _EXPORTS, spelled out for tools that read __all__ statically
    "__version__",
    "DrillOutcome",
    "DrillRequest",
    "DrillStatus",
    "ExitCode",
    "ReportOptions",
    "build_report",
    "get_drill",
    "history",
    "last_good",
    "run_drill",
    "run_policy",
    "seal",
    "verify_audit_chain",
    "verify_checkpoint",
]
