"""Every check a drill runs, in the order a report lists them."""

from __future__ import annotations

from collections.abc import Callable

from drill.checks import CheckInputs
from drill.checks.contract import check_contract
from drill.checks.discovery import check_discover
from drill.checks.durable import check_durable
from drill.checks.files import check_files
from drill.checks.integrity import check_integrity
from drill.checks.keys import check_keys
from drill.checks.load import check_load
from drill.checks.replay import check_replay
from drill.checks.resume import check_resume
from drill.findings import CheckResult

Check = Callable[[CheckInputs], CheckResult]

CHECKS: dict[str, Check] = {
    "discover": check_discover,
    "resume": check_resume,
    "integrity": check_integrity,
    "durable": check_durable,
    "files": check_files,
    "load": check_load,
    "keys": check_keys,
    "contract": check_contract,
    "replay": check_replay,
}
ORDER = tuple(CHECKS)
STATE_CHECKS = ("integrity", "durable", "files", "load", "keys", "contract")
"""What the checks stage runs over a restored checkpoint."""
LOADING_CHECKS = ("files", "load", "keys")
"""A failure in any of these means the state cannot be loaded into training objects: no replay."""


def run_checks(names: tuple[str, ...], inputs: CheckInputs) -> list[CheckResult]:
    """Run the named checks, timing each."""
    import time

    results = []
    for name in names:
        started = time.perf_counter()
        result = CHECKS[name](inputs)
        result.seconds = time.perf_counter() - started
        results.append(result)
    return results
