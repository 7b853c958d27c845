"""``drill seal`` and ``drill verify``: a checkpoint's bytes, without loading its tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from drill.cli.common import (
    AllowClassOption,
    CoverageDaysOption,
    DbOption,
    DebugOption,
    JsonOption,
    KeyFileOption,
    RequireSealedOption,
    SampleOption,
    exit_with,
    flag,
    print_json,
    seal_key,
    stderr,
    stdout,
    timeout_flag,
)
from drill.errors import UsageError

if TYPE_CHECKING:
    from drill.verifier import VerifyOutcome


def seal(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint directory to seal.")],
    force: Annotated[bool, typer.Option("--force", help="Replace a manifest that seals different content.")] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", help="Seconds sealing may take before it ends as an error (storage that never answers)."
        ),
    ] = 3600.0,
    key_file: KeyFileOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Write drill-manifest.json into a checkpoint: every file's size and xxh3-128 digests.

    Costs about one read of the files. An identical manifest is left alone; a different one
    means the checkpoint changed after sealing, and is replaced only with --force.

    Example: drill seal ./demo-run/step-100
    """
    from drill.errors import IntegrityConflict
    from drill.integrity.manifest import SealConflict
    from drill.interrupts import deadline
    from drill.units import human_bytes
    from drill.verifier import seal

    timeout_flag(timeout)
    try:
        with deadline(timeout, f"drill seal {checkpoint}"):
            result = seal(checkpoint, force=force, key=seal_key(key_file))
    except SealConflict as exc:
        raise IntegrityConflict(str(exc), hint=f"verify it first: drill verify {checkpoint}") from None
    m = result.manifest
    if json:
        print_json(
            {
                "manifest": result.path,
                "written": result.written,
                "keyed": m.key_id is not None,
                "step": m.step,
                "files": len(m.files),
                "bytes": m.total_bytes,
            }
        )
        return
    verb = (
        ("sealed with key " + m.key_id if m.key_id else "sealed")
        if result.written
        else "already sealed (identical manifest)"
    )
    stdout().print(f"{verb}: {len(m.files)} files, {human_bytes(m.total_bytes)} → {result.path}", markup=False)


def _renderer() -> None:
    """drill's renderer imported while the checkpoint's files hash, not after — and rich,
    where the verdict is printed with styles (a terminal)."""
    import drill.cli.render  # noqa: F401

    out = stdout()
    if not out.plain:
        out.rich  # noqa: B018 - loads rich's console


def _render_verified(outcome: VerifyOutcome, json: bool) -> None:
    """A verification on stdout (tables, or its JSON document), and its one line on stderr."""
    from drill.units import human_bytes, human_seconds

    r = outcome.result
    if json:
        print_json(
            {
                **r.to_dict(),
                "checkpoint": outcome.uri,
                "status": outcome.status,
                "evidence_level": outcome.evidence,
                "exit_code": int(outcome.exit_code),
                "seconds": outcome.seconds,
                "bytes_hashed": outcome.bytes_hashed,
            }
        )
    else:
        from drill.cli.render import render_check

        out = stdout()
        render_check(out, r)
        out.print(
            f"{human_bytes(outcome.bytes_hashed)} hashed in {human_seconds(outcome.seconds)}; evidence: {outcome.evidence}",
            markup=False,
            style="dim",
        )
    if r.errors:
        stderr().print(f"drill: failed: {r.errors[0].message}", markup=False)
    elif outcome.status == "unproven":
        stderr().print(
            f"drill: unproven: {outcome.uri}: no seal, and no structural proof for this format: nothing about its bytes was proven (seal it: drill seal)",
            markup=False,
        )


VerifyTarget = Annotated[str, typer.Argument(help="Checkpoint directory, or a single torch.save / safetensors file.")]
VerifyTimeout = Annotated[
    float, typer.Option("--timeout", help="Seconds the verification may take before it ends as an error.")
]


def verify(
    checkpoint: VerifyTarget,
    sample: SampleOption = "all",
    require_sealed: RequireSealedOption = False,
    coverage_days: CoverageDaysOption = 7.0,
    timeout: VerifyTimeout = 3600.0,
    key_file: KeyFileOption = None,
    allow_class: AllowClassOption = None,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Verify a checkpoint's bytes without loading its tensors.

    Sealed: every file's size and digests against drill-manifest.json (and a framework's own
    manifest, if any). Unsealed: the structural proof its format allows — DCP metadata against
    the files, a torch.save zip's CRC-32s, a safetensors header's offsets — the same one
    `drill run` gives. Nothing provable at all is "unproven" (exit 8), never a pass. Updates
    the coverage ledger.

    Example: drill verify ./demo-run/step-100 --sample auto
    """
    from drill.cli.early import taken
    from drill.integrity.sampling import parse_sample
    from drill.memory import kept
    from drill.records.ledgers import open_ledger
    from drill.verifier import verify_checkpoint

    begun = taken()  # the head start the console script began for this command line, if any

    spec = flag("--sample", parse_sample, sample)
    if not coverage_days > 0:
        raise UsageError(f"--coverage-days: must be positive, not {coverage_days}")
    timeout_flag(timeout)
    from drill.interrupts import deadline

    ledger = open_ledger(db)
    try:
        with deadline(timeout, f"drill verify {checkpoint}"), kept():  # its listing and seal: rendered, then exit
            outcome = verify_checkpoint(
                checkpoint,
                sample=spec,
                require_sealed=require_sealed,
                records=ledger,
                coverage_days=coverage_days,
                key=seal_key(key_file),
                allow_classes=tuple(allow_class or ()),
                meanwhile=None if json else _renderer,
                begun=begun,
            )
    finally:
        ledger.close()
    _render_verified(outcome, json)
    raise exit_with(outcome.exit_code)
