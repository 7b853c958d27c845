"""The checkpoint holds the parts a resume needs: model, optimizer, LR scheduler, data loader,
RNG and train state — and each part holds what that part is made of."""

from __future__ import annotations

from collections import Counter
from typing import Any

from drill import parts
from drill.checks import CheckInputs
from drill.findings import CheckResult, Finding, Severity

NAME = "keys"
INVENTORY_SHOWN = 200


def _part_shape(layout) -> dict[str, tuple[str, ...]]:  # type: ignore[no-untyped-def]
    """Sub-keys without which a part cannot be loaded back into its object (a flat-partitioned
    optimizer keeps its state as partitions, not per parameter)."""
    flat = layout is not None and layout.optimizer_keys == "flat"
    held = layout.must_hold if layout is not None else {parts.TRAIN_STATE: ("step",)}
    return {parts.OPTIMIZER: ("partitions" if flat else "state", "param_groups"), **held}


def check_keys(inputs: CheckInputs) -> CheckResult:
    restore, expectations = inputs.restore, inputs.expectations
    assert restore is not None
    if restore.metadata_error is not None:
        return CheckResult(name=NAME, summary="not checked: the checkpoint index could not be loaded", skipped=True)
    counts = Counter(key.split(".", 1)[0] for key in restore.state)
    required = expectations.parts_required(restore.layout)
    recommended = expectations.parts_recommended(restore.layout)
    hint = restore.layout.save_hint if restore.layout else "save every part with the checkpoint"
    findings = (
        _missing(counts, required, recommended, hint)
        + _never_saved(counts, restore.layout, expectations)
        + _incomplete(counts, restore.state, restore.layout)
        + _unknown(counts)
    )
    if counts[parts.MODEL] and not any(
        k.startswith(parts.MODEL + ".") and hasattr(v, "shape") for k, v in restore.state.items()
    ):
        findings.append(
            Finding(
                check=NAME,
                code="model-without-tensors",
                severity=Severity.ERROR,
                subject=parts.MODEL,
                message="the model part holds no tensors: a resume would start from untrained weights",
            )
        )
    fmt = restore.layout.format if restore.layout else restore.format
    errors = [str(f.subject) for f in findings if f.severity is Severity.ERROR]
    if errors:
        summary = "missing: " + ", ".join(errors)
    else:
        summary = f"{fmt}: holds " + ", ".join(
            f"{p} ({counts[p]})" for p in (*parts.CANONICAL_PARTS, parts.EXTRA) if counts[p]
        )
    evidence = {
        "format": fmt,
        **({"layout": restore.layout.recognized} if restore.layout and restore.layout.recognized else {}),
        "parts": {p: counts[p] for p in sorted(counts)},
        "required": list(required),
        "recommended": list(recommended),
        "missing": [f.subject for f in findings if f.code == "part-missing"],
        "not_loaded": sorted({f.key.split(".", 1)[0] for f in restore.failures}),
        **_inventory(restore.inventory),
    }
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)


def _missing(counts: Counter[str], required: tuple[str, ...], recommended: tuple[str, ...], hint: str) -> list[Finding]:
    out = []
    for part in (*required, *recommended):
        if counts[part]:
            continue
        is_required = part in required
        out.append(
            Finding(
                check=NAME,
                code="part-missing",
                severity=Severity.ERROR if is_required else Severity.WARNING,
                subject=part,
                message=f"no {part} state in the checkpoint: {parts.WHAT_A_RESUME_LOSES.get(part, 'a resume would lose it')}",
                expected=f"{part}.*",
                actual="absent",
                hint=hint
                if is_required
                else f"accepted for this format; save it for a bitwise resume, or pass --allow-missing {part}",
            )
        )
    return out


def _never_saved(counts: Counter[str], layout, expectations) -> list[Finding]:  # type: ignore[no-untyped-def]
    """Parts this layout never saves, by design: a warning saying so (an error only when a policy requires the part)."""
    if layout is None:
        return []
    explicit = set(expectations.required_parts or ())
    return [
        Finding(
            check=NAME,
            code="part-missing" if part in explicit else "part-not-saved-by-layout",
            severity=Severity.ERROR if part in explicit else Severity.WARNING,
            subject=part,
            message=f"no {part} state: {why}; {parts.WHAT_A_RESUME_LOSES.get(part, 'a resume would lose it')}",
            hint=f"expected for this layout; pass --allow-missing {part} to accept it silently",
        )
        for part, why in layout.never_saved.items()
        if not counts[part] and part not in expectations.allow_missing
    ]


def _incomplete(counts: Counter[str], state: dict[str, Any], layout: Any) -> list[Finding]:
    out = []
    for part, needed in _part_shape(layout).items():
        if not counts[part]:
            continue
        for sub in needed:
            prefix = f"{part}.{sub}"
            if not any(k == prefix or k.startswith(prefix + ".") for k in state):
                why = parts.WHAT_A_RESUME_LOSES.get(part, "")
                out.append(
                    Finding(
                        check=NAME,
                        code="part-incomplete",
                        severity=Severity.ERROR,
                        subject=prefix,
                        message=f"{part} has no {sub!r}: {why}".rstrip(": "),
                        expected=prefix,
                        actual="absent",
                    )
                )
    return out


def _unknown(counts: Counter[str]) -> list[Finding]:
    return [
        Finding(
            check=NAME,
            code="part-unknown",
            severity=Severity.INFO,
            subject=part,
            message=f"{part} ({counts[part]} entries) is not a canonical part; drill restores it but does not check it",
        )
        for part in sorted(p for p in counts if p not in parts.CANONICAL_PARTS and p != parts.EXTRA)
    ]


def _inventory(inventory: list) -> dict:
    tensors: dict[str, dict[str, int]] = {}
    for info in inventory:
        slot = tensors.setdefault(info.key.split(".", 1)[0], {"tensors": 0, "bytes": 0})
        slot["tensors"] += 1
        slot["bytes"] += info.nbytes
    return {
        "tensors": tensors,
        "inventory_entries": len(inventory),
        # The first entries in full (key, shape, dtype, bytes, rank); a 70B model has ~10^5.
        "inventory": [
            {
                "key": i.key,
                "shape": list(i.shape),
                "dtype": i.dtype,
                "bytes": i.nbytes,
                **({"rank": i.rank} if i.rank is not None else {}),
            }
            for i in inventory[:INVENTORY_SHOWN]
        ],
    }
