"""``drill submit``: run a policy's drill as a Slurm job, or render it as a Kubernetes Job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from drill.cli.common import DbOption, DebugOption, JsonOption, exit_with, print_json, stderr, write_output
from drill.errors import UsageError


def submit(
    policy: Annotated[
        Path, typer.Option("--policy", help="The policy whose drill to launch (its allocation: section sizes the job).")
    ],
    launcher: Annotated[
        str | None, typer.Option("--launcher", help="slurm or k8s (default: the policy's allocation.launcher).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the batch script (or manifests) without submitting or applying.")
    ] = False,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="k8s: write the manifests here instead of stdout.")
    ] = None,
    cron: Annotated[
        bool, typer.Option("--cron", help="k8s: a CronJob on the policy's schedule instead of a Job for now.")
    ] = False,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Launch a policy's drill as a batch job: Slurm (submitted, followed, recorded) or Kubernetes.

    Slurm: sbatch runs `srun drill run --policy FILE` on nodes × ranks_per_node tasks; drill
    follows the job (squeue, then scontrol or sacct) and exits with the drill's exit code. A
    job Slurm refuses, one Slurm says can never run (a partition's limit, an unknown account:
    cancelled at once), one cancelled after allocation.queue_timeout in the queue, or one
    that dies under the drill is recorded as an error, naming the job's output file. Ctrl-C
    (or SIGTERM) cancels the job and records the drill as aborted. Kubernetes: with a cluster
    configured (a service account, $KUBECONFIG or ~/.kube/config) the indexed Job is applied
    and followed the same way; without one, or with --dry-run, -o or --cron (a CronJob on the
    policy's schedule), the manifests — Job, headless Service, ConfigMap, ready for the
    restricted Pod Security level — are printed to kubectl apply.

    Example: drill submit --policy policies/sharded-slurm.yaml --launcher slurm
    """
    from drill.cli.nightly import load_policy_or_fail
    from drill.launch.jobs import Interrupted
    from drill.launch.slurm import log_dir
    from drill.launch.submit import submit_slurm

    loaded = load_policy_or_fail(policy)
    kind = launcher or loaded.allocation.launcher
    if kind not in ("slurm", "k8s"):
        raise UsageError(
            f"--launcher: {kind!r}: expected slurm or k8s (policy {loaded.name} has allocation.launcher: {loaded.allocation.launcher})"
        )
    if kind == "slurm" and (output is not None or cron):
        raise UsageError(
            "--output and --cron are for k8s manifests; a Slurm job's script prints with --dry-run, and the scheduler runs Slurm policies nightly"
        )
    try:
        if kind == "k8s":
            sub = _k8s(loaded, db=db, dry_run=dry_run, output=output, cron=cron)
            if sub is None:
                return None
        else:
            sub = submit_slurm(
                loaded,
                db=db,
                dry_run=dry_run,
                on_state=_Progress("slurm job", lambda job: f"output: {log_dir(loaded)}/drill-{job}.out"),
            )
    except Interrupted as stopped:  # Ctrl-C or SIGTERM: the job was cancelled and the drill recorded aborted
        sub = stopped.submission
    if dry_run:
        return _emit(sub.text, None)
    _report(sub, json=json)


def _k8s(policy, *, db: str | None, dry_run: bool, output: str | None, cron: bool):  # type: ignore[no-untyped-def]
    """Apply and follow the Job when a cluster is configured; else (or asked to) print the manifests."""
    from drill.launch.k8s import warnings_for
    from drill.launch.k8s_api import configured_api
    from drill.launch.submit import render_k8s, submit_k8s

    if not policy.allocation.image:
        raise UsageError(f"policy {policy.path}: allocation.image is required for k8s (the image with drill installed)")
    for warning in warnings_for(policy):
        stderr().print(f"drill: warning: {warning}", markup=False)
    api = None if (dry_run or output is not None or cron) else configured_api()
    if api is None:
        if not (dry_run or output is not None or cron):
            stderr().print(
                "drill: no Kubernetes cluster is configured (a service account, $KUBECONFIG or ~/.kube/config): the manifests, to apply",
                markup=False,
            )
        _emit(render_k8s(policy, cron=cron).text, output)
        return None
    namespace = policy.allocation.namespace or "default"
    return submit_k8s(
        policy,
        api,
        db=db,
        on_state=_Progress("kubernetes Job", lambda job: f"logs: kubectl logs -n {namespace} job/{job}"),
    )


class _Progress:
    """One line on stderr per change of the job's state."""

    def __init__(self, kind: str, output: Callable[[str], str]) -> None:
        self.kind, self.output, self.job = kind, output, "?"

    def __call__(self, state: str, detail: str) -> None:
        if state == "SUBMITTED":
            self.job = detail
            line = f"submitted {self.kind} {detail} ({self.output(detail)})"
        else:
            line = f"{self.kind} {self.job}: {state.lower()}" + (f" ({detail})" if detail and detail != "None" else "")
        stderr().print(f"drill: {line}", markup=False)


def _emit(text: str, output: str | None) -> None:
    if output is None:
        typer.echo(text, nl=False)
        return
    write_output(output, text)
    stderr().print(f"wrote {output}", markup=False)


def _report(sub, *, json: bool) -> None:  # type: ignore[no-untyped-def]
    from drill.cli.common import stdout
    from drill.cli.render import render_outcome

    outcome = sub.outcome
    assert outcome is not None
    if sub.end is not None:
        end = sub.end
        why = f" ({end.reason})" if end.reason and end.reason != "None" else ""
        stderr().print(f"drill: {end.name} ended {end.state}{why} after {end.seconds:.0f} s", markup=False)
    if json:
        print_json(outcome.to_document())
    else:
        render_outcome(stdout(), outcome, None)
    if outcome.status.value != "passed" and outcome.message:
        stderr().print(f"drill: {outcome.status.value}: drill #{outcome.id}: {outcome.message}", markup=False)
    raise exit_with(outcome.exit_code)
