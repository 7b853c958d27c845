"""A policy's drill as a Slurm batch job: the script, its submission, and its end.

The job runs ``srun drill run --policy FILE`` on ``nodes × ranks_per_node`` tasks; every task
is one rank of the drill (``SLURM_PROCID``/``SLURM_NTASKS``), meeting through a ``file://``
rendezvous in a directory every node sees, so nothing listens on a port. The rendezvous is a
fresh directory per attempt (job id, restart count and a random suffix; earlier ones of the
same job id removed first, this one removed on exit, TERM and INT), so a stale one — a job
killed before its trap ran, a job id reused by a new cluster — can never decide this job's
verdict. Rank 0 records the drill with ``job_id = slurm:<id>#<nonce>`` (the nonce is the
submission's: a reused job id never finds another job's record) and leaves its verdict next to
the job's output; the script ends with ``drill verdict``, so the job exits with drill's code.
:func:`wait` follows the job with ``squeue`` — cancelling it at once when Slurm says it can
never run — and reads how it ended from ``scontrol`` (or ``sacct``).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from drill.launch.jobs import Interrupted, JobEnd, follow
from drill.policy.model import Policy

NEVER_RUNS = {
    "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied",
    "QOSMaxWallDurationPerJobLimit", "QOSMaxNodePerJobLimit", "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob", "QOSMaxMemoryPerJob",
    "AssocMaxWallDurationPerJobLimit", "AssocMaxNodesPerJobLimit", "AssocMaxCpuPerJobLimit", "AccountNotAllowed", "QOSNotAllowed",
}  # fmt: skip
"""Pending reasons that say the job as asked can never start (a limit it exceeds, a thing that
does not exist): waiting out the queue timeout would only delay the error."""

FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


MAX_UNANSWERED = 120
"""Polls (about a second apart) without an answer from Slurm before the job counts as ended."""


class SubmitError(Exception):
    """Slurm refused the job, or could not be asked; the message is Slurm's own."""


def time_limit_minutes(policy: Policy) -> int:
    limit = policy.allocation.time_limit or policy.limits.timeout + 600
    return max(1, math.ceil(limit / 60))


def log_dir(policy: Policy) -> str:
    return os.path.abspath(policy.allocation.log_dir or ".")


def output_path(policy: Policy, job_id: str) -> str:
    """The job's output file (``#SBATCH --output``)."""
    return f"{log_dir(policy)}/drill-{job_id}.out"


def verdict_path(policy: Policy, job_id: str) -> str:
    """Where rank 0 leaves the drill's verdict, beside the job's output."""
    return f"{log_dir(policy)}/drill-{job_id}.verdict.json"


def new_nonce() -> str:
    return secrets.token_hex(4)


def render(policy: Policy, *, db_url: str | None, trigger: str = "policy", nonce: str | None = None) -> str:
    """The batch script: ``#SBATCH`` lines from the policy's allocation, then ``srun`` of
    ``drill run --policy`` on every task, then ``drill verdict`` (the job's exit code is
    drill's). ``db_url`` None: the job takes ``$DRILL_DATABASE_URL`` from the submitting
    environment (never a password in the script). ``nonce`` ties the record to this submission."""
    a = policy.allocation
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=drill-{policy.name}",
        f"#SBATCH --nodes={a.nodes}",
        f"#SBATCH --ntasks-per-node={a.ranks_per_node}",
        f"#SBATCH --time={time_limit_minutes(policy)}",
        f"#SBATCH --output={log_dir(policy)}/drill-%j.out",
        "#SBATCH --open-mode=append",  # a requeued job's earlier attempts stay in its output
    ]
    if a.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={a.gpus_per_node}")
    lines += [f"#SBATCH --{k}={v}" for k, v in (("partition", a.partition), ("account", a.account)) if v]
    lines += [f"#SBATCH {arg}" for arg in a.sbatch_args]
    rdzv = shlex.quote((a.rendezvous or "/tmp").rstrip("/") or "/")
    python = shlex.quote(sys.executable)
    drill = [
        sys.executable,
        "-m",
        "drill",
        "run",
        "--policy",
        os.path.abspath(policy.path),
        "--trigger",
        trigger,
        "--quiet",
    ]
    if db_url:
        drill += ["--db", db_url]
    verdict = shlex.quote(log_dir(policy)) + '/drill-"$SLURM_JOB_ID".verdict.json'
    lines += [
        "set -uo pipefail",
        # A rendezvous of this attempt only; any an earlier job with this id left is removed first.
        f'rm -rf {rdzv}/drill-rdzv-"$SLURM_JOB_ID"-* {verdict}',
        f'rdzv="$(mktemp -d {rdzv}/drill-rdzv-"$SLURM_JOB_ID"-"${{SLURM_RESTART_COUNT:-0}}"-XXXXXXXX)" || exit 5',
        "trap 'rm -rf \"$rdzv\"' EXIT",
        "trap 'rm -rf \"$rdzv\"; exit 143' TERM",
        "trap 'rm -rf \"$rdzv\"; exit 130' INT",
        'export DRILL_DIST_INIT="file://$rdzv/store"',
        f'export DRILL_JOB_ID="slurm:$SLURM_JOB_ID#{nonce or new_nonce()}"',
        f"export DRILL_VERDICT_FILE={verdict}",
        # One failed rank ends the step: the others would only wait for it.
        "srun --kill-on-bad-exit=1 --overcommit " + shlex.join(drill),
        f"{python} -m drill verdict {verdict}",
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


UNANSWERED = "UNANSWERED"
"""What :func:`state` says while neither ``squeue`` nor ``scontrol`` answers (a busy controller)."""


def state(job_id: str, env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(state, reason) while the job is queued or running; None once it has ended. ``squeue``
    first; when it shows nothing — a job between states (a requeue), or a controller too busy
    to answer — ``scontrol`` decides: a job it knows in a state that is not final lives on, and
    :data:`UNANSWERED` when neither answers."""
    res = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], env)
    line = res.stdout.strip()
    if res.returncode == 0 and line:
        st, _, reason = line.partition("|")
        return st, reason
    st, _, reason, _ = final(job_id, env)
    if st == "UNKNOWN":
        return None if res.returncode == 0 else (UNANSWERED, "squeue and scontrol did not answer")
    return None if st.split()[0] in FINAL_STATES else (st, reason)


def final(job_id: str, env: dict[str, str] | None = None) -> tuple[str, int | None, str, str | None]:
    """How the job ended: (state, exit code, reason, batch host), from scontrol, else sacct."""
    res = _run(["scontrol", "show", "job", "-o", job_id], env)
    if res.returncode == 0 and "JobState=" in res.stdout:
        fields = dict(re.findall(r"(\w+)=(\S*)", res.stdout))
        code = fields.get("ExitCode", "")
        host = fields.get("BatchHost") or None
        st = fields.get("JobState", "UNKNOWN")
        reason = (_cancelled_by(job_id, env) if st == "CANCELLED" else None) or fields.get("Reason", "None")
        return st, int(code.split(":")[0]) if code[:1].isdigit() else None, reason, host
    res = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode,NodeList"], env)
    if res.returncode == 0 and res.stdout.strip():
        st, code, nodes = (res.stdout.strip().splitlines()[0].split("|") + ["", ""])[:3]
        return st.split()[0], int(code.split(":")[0]) if code[:1].isdigit() else None, "None", nodes or None
    return "UNKNOWN", None, "the job left the queue and Slurm no longer knows how it ended", None


def _cancelled_by(job_id: str, env: dict[str, str] | None) -> str | None:
    """``cancelled by alice``: who cancelled the job, where Slurm's accounting says (``sacct``'s
    ``CANCELLED by UID``); None without accounting."""
    import pwd

    try:
        res = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"], env)
    except SubmitError:
        return None
    found = re.search(r"CANCELLED by (\d+)", res.stdout) if res.returncode == 0 else None
    if found is None:
        return None
    uid = int(found.group(1))
    try:
        return f"cancelled by {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"cancelled by uid {uid}"


def cancel(job_id: str, env: dict[str, str] | None = None) -> None:
    _run(["scancel", job_id], env)


@dataclass(slots=True)
class SlurmJob:
    """A submitted job, for :func:`~drill.launch.jobs.follow`."""

    job_id: str
    env: dict[str, str] | None = None
    kind: str = "slurm job"

    unanswered: int = 0

    def state(self) -> tuple[str, str] | None:
        now = state(self.job_id, self.env)
        self.unanswered = self.unanswered + 1 if now is not None and now[0] == UNANSWERED else 0
        if now is None or self.unanswered > MAX_UNANSWERED:
            return None  # ended, or the controller is gone: final() says what it can
        return now[0], f"Slurm's reason: {now[1]}" if now[1] and now[1] != "None" else ""

    def never_runs(self, reason: str) -> bool:
        return reason.removeprefix("Slurm's reason: ") in NEVER_RUNS

    def cancel(self) -> None:
        cancel(self.job_id, self.env)

    def final(self) -> tuple[str, int | None, str, str | None]:
        return final(self.job_id, self.env)


def wait(
    job_id: str,
    *,
    queue_timeout: float,
    env: dict[str, str] | None = None,
    poll: float = 1.0,
    on_state: Any = None,
    stop: Any = None,
) -> JobEnd:
    """Follow the job to its end (see :func:`~drill.launch.jobs.follow`)."""
    return follow(SlurmJob(job_id, env), queue_timeout=queue_timeout, poll=poll, on_state=on_state, stop=stop)


__all__ = [
    "FINAL_STATES",
    "NEVER_RUNS",
    "Interrupted",
    "JobEnd",
    "SlurmJob",
    "SubmitError",
    "cancel",
    "final",
    "new_nonce",
    "output_path",
    "render",
    "state",
    "submit",
    "time_limit_minutes",
    "verdict_path",
    "wait",
]
