"""A policy's drill as a Slurm batch job: the script, its submission, and its end.

The job runs ``srun drill run --policy FILE`` on ``nodes × ranks_per_node`` tasks; every task
is one rank of the drill (``SLURM_PROCID``/``SLURM_NTASKS``), meeting through a ``file://``
rendezvous in a directory every node sees, so nothing listens on a port. Rank 0 records the
drill with ``job_id = slurm:<id>``; :func:`wait` follows the job with ``squeue`` and reads
how it ended from ``scontrol`` (or ``sacct`` where accounting keeps it longer).
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from drill.policy.model import Policy

FINAL_STATES = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class SubmitError(Exception):
    """Slurm refused the job, or could not be asked; the message is Slurm's own."""


@dataclass(frozen=True, slots=True)
class JobEnd:
    job_id: str
    state: str
    """Slurm's final state (COMPLETED, FAILED, TIMEOUT, …), or QUEUE_TIMEOUT when drill gave up waiting."""
    exit_code: int | None
    reason: str
    pending_seconds: float
    seconds: float


def time_limit_minutes(policy: Policy) -> int:
    limit = policy.allocation.time_limit or policy.limits.timeout + 600
    return max(1, math.ceil(limit / 60))


def log_dir(policy: Policy) -> str:
    import os

    return os.path.abspath(policy.allocation.log_dir or ".")


def render(policy: Policy, *, db_url: str | None, trigger: str = "policy") -> str:
    """The batch script: ``#SBATCH`` lines from the policy's allocation, then ``srun`` of
    ``drill run --policy`` on every task. ``db_url`` None: the job takes
    ``$DRILL_DATABASE_URL`` from the submitting environment (never a password in the script)."""
    a = policy.allocation
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=drill-{policy.name}",
        f"#SBATCH --nodes={a.nodes}",
        f"#SBATCH --ntasks-per-node={a.ranks_per_node}",
        f"#SBATCH --time={time_limit_minutes(policy)}",
        f"#SBATCH --output={log_dir(policy)}/drill-%j.out",
    ]
    if a.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={a.gpus_per_node}")
    lines += [f"#SBATCH --{k}={v}" for k, v in (("partition", a.partition), ("account", a.account)) if v]
    lines += [f"#SBATCH {arg}" for arg in a.sbatch_args]
    rdzv = (a.rendezvous or "/tmp").rstrip("/")
    drill = [sys.executable, "-m", "drill", "run", "--policy", policy.path, "--trigger", trigger, "--quiet"]
    if db_url:
        drill += ["--db", db_url]
    lines += [
        "set -euo pipefail",
        f'export DRILL_DIST_INIT="file://{rdzv}/drill-rdzv-$SLURM_JOB_ID"',
        f'trap \'rm -f "{rdzv}/drill-rdzv-$SLURM_JOB_ID"\' EXIT',
        # One failed rank ends the step: the others would only wait for it.
        "srun --kill-on-bad-exit=1 --overcommit " + shlex.join(drill),
    ]
    return "\n".join(lines) + "\n"


def _run(cmd: list[str], env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=60)
    except FileNotFoundError:
        raise SubmitError(f"{cmd[0]} not found: is this a Slurm submit host?") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{cmd[0]} did not answer within 60 s: is slurmctld up?") from None


def submit(script: str, env: dict[str, str] | None = None) -> str:
    """``sbatch`` the script; the job id, or :class:`SubmitError` with Slurm's reason."""
    res = _run(["sbatch", "--parsable"], env, script)
    if res.returncode != 0:
        lines = [ln.removeprefix("sbatch: error: ") for ln in res.stderr.strip().splitlines() if ln.strip()]
        raise SubmitError("slurm refused the job: " + ("; ".join(lines) or f"sbatch exited {res.returncode}"))
    return res.stdout.strip().split(";")[0]


def state(job_id: str, env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(state, reason) while the job is queued or running; None once it has left the queue."""
    res = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], env)
    line = res.stdout.strip()
    if res.returncode != 0 or not line:
        return None
    st, _, reason = line.partition("|")
    return st, reason


def final(job_id: str, env: dict[str, str] | None = None) -> tuple[str, int | None, str]:
    """How the job ended: (state, exit code, reason), from scontrol, else sacct."""
    res = _run(["scontrol", "show", "job", "-o", job_id], env)
    if res.returncode == 0 and "JobState=" in res.stdout:
        fields = dict(re.findall(r"(\w+)=(\S*)", res.stdout))
        code = fields.get("ExitCode", "")
        return fields.get("JobState", "UNKNOWN"), int(code.split(":")[0]) if code[:1].isdigit() else None, fields.get("Reason", "None")
    res = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"], env)
    if res.returncode == 0 and res.stdout.strip():
        st, _, code = res.stdout.strip().splitlines()[0].partition("|")
        return st.split()[0], int(code.split(":")[0]) if code[:1].isdigit() else None, "None"
    return "UNKNOWN", None, "the job left the queue and Slurm no longer knows how it ended"


def cancel(job_id: str, env: dict[str, str] | None = None) -> None:
    _run(["scancel", job_id], env)


def wait(job_id: str, *, queue_timeout: float, env: dict[str, str] | None = None, poll: float = 1.0, on_state: Any = None) -> JobEnd:
    """Follow the job to its end; cancel it if it waits in the queue past ``queue_timeout``."""
    started = time.monotonic()
    pending_for, last = 0.0, None
    while (now := state(job_id, env)) is not None:
        st, reason = now
        if st != last and on_state is not None:
            on_state(st, reason)
        last = st
        if st == "PENDING":
            pending_for = time.monotonic() - started
            if pending_for > queue_timeout:
                cancel(job_id, env)
                return JobEnd(job_id, "QUEUE_TIMEOUT", None, f"still pending after {queue_timeout:g} s (Slurm's reason: {reason})", pending_for, pending_for)
        time.sleep(poll)
    st, code, reason = final(job_id, env)
    return JobEnd(job_id, st, code, reason, pending_for, time.monotonic() - started)


__all__ = ["FINAL_STATES", "JobEnd", "SubmitError", "cancel", "final", "render", "state", "submit", "time_limit_minutes", "wait"]
