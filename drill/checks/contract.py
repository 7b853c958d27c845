"""The resume contract: is the state that a resume needs all there, and consistent?

Hashes prove the bytes; this proves the *state*: optimizer moments for every parameter,
step counters that agree, RNG for every generator and rank, data-loader state that fixes the
data order (not just a position), no NaN/Inf, nothing still at its initial zeros. Every
finding names the part, the key path and the rank, and what a resume would suffer.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

from drill import parts
from drill.checks import CheckInputs
from drill.findings import PER_CODE, CheckResult, Finding, Severity
from drill.formats.canonical import Layout
from drill.formats.layouts import optimizer_params
from drill.ranks import absent, absent_from, each_missing
from drill.restore.finite import scan

NAME = "contract"
ADAM_SLOTS = ("exp_avg", "exp_avg_sq", "step")
_RANKED = re.compile(r"^(?:dp_)?rank_(\d+)\Z")
_ORDER_KEYS = re.compile(r"(seed|generator|sampler|shuffle|order|permutation|rng)", re.I)
GENERATORS = {
    "python": ("python", "py", "random"),
    "numpy": ("numpy", "np"),
    "torch CPU": ("torch", "cpu", "torch_cpu"),
}


def _f(code: str, subject: str | None, message: str, *, severity: Severity = Severity.ERROR, **kw: Any) -> Finding:
    return Finding(check=NAME, code=code, severity=severity, subject=subject, message=message, **kw)


def _part(state: Mapping[str, Any], part: str) -> dict[str, Any]:
    prefix = part + "."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _as_int(value: Any) -> int | None:
    """A step counter as an int; None for anything that is not a finite whole number (a NaN or
    a list where a count belongs is the checkpoint's problem, reported as a missing counter)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value)


# -- optimizer ------------------------------------------------------------------------------
def _param_groups(opt: Mapping[str, Any]) -> list[list[Any]]:
    groups: dict[int, list[Any]] = {}
    for key, value in opt.items():
        m = re.match(r"^param_groups\.(\d+)\.params$", key)
        if m and isinstance(value, (list, tuple)):
            groups[int(m.group(1))] = list(value)
    return [groups[i] for i in sorted(groups)]


def _adam_slots(opt: Mapping[str, Any]) -> tuple[str, ...]:
    """The slots every parameter's state must hold: Adam's two moments, and a per-parameter
    step where the optimizer keeps one (Megatron keeps its step in the param groups)."""
    state_keys = [k for k in opt if k.startswith("state.")]
    if not (
        any(k.endswith(".exp_avg") for k in state_keys) or any(re.match(r"^param_groups\..+\.betas", k) for k in opt)
    ):
        return ()
    return (
        ("exp_avg", "exp_avg_sq", "step") if any(k.endswith(".step") for k in state_keys) else ("exp_avg", "exp_avg_sq")
    )


def _missing_slots(opt: Mapping[str, Any], param: str, label: str, slots: tuple[str, ...]) -> list[Finding]:
    """One finding per optimizer slot (``exp_avg``…) the parameter's state lacks."""
    return [
        _f(
            "optimizer-slot-missing",
            f"optimizer.state.{param}.{slot}",
            f"no {slot} for {label}: a resume would restart its AdamW moments from zero and spike the loss",
            expected=slot,
            actual="absent",
        )
        for slot in slots
        if f"state.{param}.{slot}" not in opt
    ]


def _stateless(opt: Mapping[str, Any], members: list[Any], by_name: bool) -> set[str]:
    """The grouped parameters with no optimizer state at all, when others have some: never
    updated — frozen (a LoRA run's base weights sit in the groups, only the adapters step) —
    not damaged. Freezing is done module by module: a named parameter whose module's other
    parameters have state (``0.weight`` without, ``0.bias`` with) lost its state, and its
    missing slots are named, as are those of a parameter with part of its state."""
    have = {
        k[6:].rsplit(".", 1)[0] for k in opt if k.startswith("state.") and k.count(".") >= 2
    }  # state.<param>.<slot>
    if not have:
        return set()
    stateless = {str(p) for p in members if str(p) not in have}
    if not by_name:
        return stateless
    stepping = {_module_of(p) for p in have}
    return {p for p in stateless if _module_of(p) not in stepping}


def _module_of(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else ""


def _frozen_note(frozen: set[str]) -> list[Finding]:
    if not frozen:
        return []
    named = ", ".join(sorted(frozen)[:5]) + (f" and {len(frozen) - 5} more" if len(frozen) > 5 else "")
    return [
        _f(
            "param-never-updated",
            "optimizer.state",
            f"{len(frozen)} parameter(s) in the param groups have no optimizer state at all: never updated, as frozen "
            f"parameters are (a LoRA run's base weights), not damaged: {named}",
            severity=Severity.INFO,
            actual=len(frozen),
        )
    ]


def check_optimizer(state: Mapping[str, Any], layout: Layout) -> tuple[list[Finding], dict[str, Any]]:
    opt = _part(state, parts.OPTIMIZER)
    model = {k: v for k, v in _part(state, parts.MODEL).items() if isinstance(v, torch.Tensor)}
    if not opt:
        return [], {}
    if layout.optimizer_keys == "flat":
        return check_partitions(opt, layout)
    grouped = [p for g in _param_groups(opt) for p in g]
    findings = [
        _f(
            "param-in-two-groups",
            f"optimizer.param_groups[*].params: {p}",
            f"parameter {p} is in more than one param group: a resume would step it twice",
        )
        for p in sorted(str(p) for p, n in Counter(grouped).items() if n > 1)
    ]
    members = grouped
    # Keyed as the state says, whatever the layout: dcp.save of a plain optimizer.state_dict()
    # keeps torch.optim's parameter indices (param_groups.N.params = [0, 1, …]), not names.
    by_name = layout.optimizer_keys == "fqn" and not any(re.match(r"^state\.\d+\.[^.]+$", k) for k in opt)
    if by_name:  # the parameters the state names, and those the groups list by name
        named = sorted(optimizer_params({f"{parts.OPTIMIZER}.{k}" for k in opt}))
        members = list(dict.fromkeys([p for p in grouped if isinstance(p, str)] + named))
    slots = _adam_slots(opt)
    frozen = _stateless(opt, members, by_name)
    findings += _frozen_note(frozen)
    findings += (_slots_by_name if by_name else _slots_by_index)(opt, model, members, slots, frozen)
    if not by_name:
        findings += _unoptimized_by_count(model, members)
    return findings, {
        "params_checked": len(members), "params_frozen": len(frozen), "slots": list(slots),
        "keyed_by": "name" if by_name else "index",
    }  # fmt: skip


_PARTITION = re.compile(r"^partitions\.rank_(\d+)\.(\d+)\.([^.]+)\Z")


def check_partitions(opt: Mapping[str, Any], layout: Layout) -> tuple[list[Finding], dict[str, Any]]:
    """A flat-partitioned optimizer (ZeRO): every rank that saved holds, for every parameter
    group, an fp32 partition and each moment the optimizer keeps, element for element; the
    ranks' partitions are the same size and together cover the group's parameters; and every
    rank is at the same step."""
    held: dict[int, dict[int, dict[str, Any]]] = {}
    for key, value in opt.items():
        if m := _PARTITION.match(key):
            held.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), {})[m.group(3)] = value
    adam = any("exp_avg" in g for r in held.values() for g in r.values()) or any(
        re.match(r"^param_groups\.\d+\.betas", k) for k in opt
    )
    slots = ("exp_avg", "exp_avg_sq") if adam else ()
    groups = max(len(layout.flat_groups), 1 + max((g for r in held.values() for g in r), default=-1))
    findings: list[Finding] = []
    findings += each_missing(
        absent_from(layout.saved_ranks, held),
        lambda rank: _f(
            "optimizer-partition-missing",
            f"optimizer.partitions.rank_{rank}",
            f"rank {rank} holds no optimizer partition: a resume would lose its share of the fp32 weights and AdamW moments",
            rank=rank,
        ),
    )
    for rank, mine in sorted(held.items()):  # group numbers come from the keys: counted, never enumerated
        for g in sorted(mine):
            findings += _partition_findings(rank, g, mine[g], slots)
        findings += each_missing(absent(mine, groups), functools.partial(_group_missing, rank, slots))
    findings += _coverage(
        held, layout, sorted({g for mine in held.values() for g in mine} | set(range(len(layout.flat_groups))))
    )
    steps = {r: s for r, mine in held.items() for g in mine.values() if (s := _as_int(g.get("step"))) is not None}
    if len(set(steps.values())) > 1:
        findings.append(
            _f(
                "step-mismatch",
                "optimizer.partitions",
                f"the ranks' optimizer partitions are at different steps ({', '.join(f'rank {r}: {s}' for r, s in sorted(steps.items()))}): a resume would mix optimizer states of different steps",
                actual=steps,
            )
        )
    return findings, {
        "params_checked": sum(len(m) for m in held.values()),
        "slots": ["fp32", *slots],
        "keyed_by": "flat partition",
        "ranks": sorted(held),
    }


def _group_missing(rank: int, moments: tuple[str, ...], group: int) -> Finding:
    return _partition_findings(rank, group, {}, moments)[0]


def _partition_findings(rank: int, group: int, slots: Mapping[str, Any], moments: tuple[str, ...]) -> list[Finding]:
    where = f"optimizer.partitions.rank_{rank}.{group}"
    fp32 = slots.get("fp32")
    if not isinstance(fp32, torch.Tensor):
        return [
            _f(
                "optimizer-partition-missing",
                f"{where}.fp32",
                f"rank {rank} holds no fp32 partition of parameter group {group}: a resume would lose its share of the master weights",
                rank=rank,
            )
        ]
    out = []
    for slot in moments:
        value = slots.get(slot)
        if not isinstance(value, torch.Tensor):
            out.append(
                _f(
                    "optimizer-slot-missing",
                    f"{where}.{slot}",
                    f"no {slot} for rank {rank}'s partition of parameter group {group}: a resume would restart its AdamW moments from zero and spike the loss",
                    rank=rank,
                    expected=slot,
                    actual="absent",
                )
            )
        elif value.numel() != fp32.numel():
            out.append(
                _f(
                    "optimizer-slot-mismatch",
                    f"{where}.{slot}",
                    f"{slot} of rank {rank}'s partition of group {group} holds {value.numel()} elements, the partition {fp32.numel()}: the optimizer state belongs to a different partitioning",
                    rank=rank,
                    expected=fp32.numel(),
                    actual=value.numel(),
                )
            )
    return out


def _coverage(held: Mapping[int, Mapping[int, Mapping[str, Any]]], layout: Layout, groups: list[int]) -> list[Finding]:
    out = []
    for g in groups:
        sizes = {r: t.numel() for r, mine in held.items() if isinstance(t := mine.get(g, {}).get("fp32"), torch.Tensor)}
        if len(set(sizes.values())) > 1:
            out.append(
                _f(
                    "optimizer-partition-mismatch",
                    f"optimizer.partitions.*.{g}",
                    f"the ranks' partitions of parameter group {g} differ in size ({', '.join(f'rank {r}: {n}' for r, n in sorted(sizes.items()))}): they were not cut from one group",
                    actual=sizes,
                )
            )
        need = layout.flat_groups[g] if g < len(layout.flat_groups) else None
        if need is not None and len(sizes) == len(layout.saved_ranks) and sum(sizes.values()) < need:
            out.append(
                _f(
                    "optimizer-partition-mismatch",
                    f"optimizer.partitions.*.{g}",
                    f"the partitions of parameter group {g} hold {sum(sizes.values())} elements, its parameters {need}: the optimizer state belongs to a different model",
                    expected=need,
                    actual=sum(sizes.values()),
                )
            )
    return out


def _trainable(model: Mapping[str, torch.Tensor]) -> list[str]:
    return [
        fqn for fqn, t in model.items() if t.is_floating_point() and fqn.endswith(("weight", "bias"))
    ]  # buffers are not optimized


def _unoptimized_by_count(model: Mapping[str, torch.Tensor], members: list[Any]) -> list[Finding]:
    """Index-keyed param groups cannot say which parameter each index is, only how many there
    are: fewer than the model's weights and biases is worth a warning, every one is not."""
    trainable = _trainable(model)
    if not members or len(set(members)) >= len(trainable):
        return []
    return [
        _f(
            "param-not-optimized",
            "optimizer.param_groups[*].params",
            f"the param groups hold {len(set(members))} parameters, the model {len(trainable)} weights and biases: "
            "some are frozen on purpose, or a resume would never train them",
            severity=Severity.WARNING,
            expected=len(trainable),
            actual=len(set(members)),
        )
    ]


def _slots_by_name(
    opt: Mapping[str, Any],
    model: Mapping[str, torch.Tensor],
    members: list[Any],
    slots: tuple[str, ...],
    frozen: set[str],
) -> list[Finding]:
    """Optimizer state keyed by parameter name (DCP): each slot against its parameter."""
    findings: list[Finding] = []
    for fqn in (m for m in members if str(m) not in frozen):
        findings += _missing_slots(opt, str(fqn), f"parameter {fqn}", slots)
        param = model.get(fqn)
        for slot in slots:
            value = opt.get(f"state.{fqn}.{slot}")
            if slot == "step" or not isinstance(value, torch.Tensor) or param is None:
                continue
            if tuple(value.shape) != tuple(param.shape) or value.dtype != param.dtype:
                findings.append(
                    _f(
                        "optimizer-slot-mismatch",
                        f"optimizer.state.{fqn}.{slot}",
                        f"{slot} of {fqn} is {tuple(value.shape)} {value.dtype}, the parameter {tuple(param.shape)} {param.dtype}: "
                        "the optimizer state belongs to a different model",
                        expected=f"{tuple(param.shape)} {param.dtype}",
                        actual=f"{tuple(value.shape)} {value.dtype}",
                    )
                )
    grouped = {str(m) for m in members}
    findings += [
        _f(
            "param-not-optimized",
            f"model.{fqn}",
            f"model.{fqn} is in no optimizer param group: frozen on purpose, or a resume would never train it",
            severity=Severity.WARNING,
        )
        for fqn in _trainable(model)
        if fqn not in grouped and members
    ]
    return findings


def _slots_by_index(
    opt: Mapping[str, Any],
    model: Mapping[str, torch.Tensor],
    members: list[Any],
    slots: tuple[str, ...],
    frozen: set[str],
) -> list[Finding]:
    """torch.optim's own index-keyed state: slots present, and moments shaped like some parameter."""
    findings: list[Finding] = []
    shapes = Counter(tuple(t.shape) for t in model.values() if t.is_floating_point())
    for idx in (m for m in members if str(m) not in frozen):
        findings += _missing_slots(opt, str(idx), f"parameter #{idx}", slots)
        moment = opt.get(f"state.{idx}.exp_avg")
        if not isinstance(moment, torch.Tensor) or not model:
            continue
        shape = tuple(moment.shape)
        if shapes[shape] > 0:
            shapes[shape] -= 1
            continue
        findings.append(
            _f(
                "optimizer-slot-mismatch",
                f"optimizer.state.{idx}.exp_avg",
                f"exp_avg of parameter #{idx} has shape {shape}, which no remaining model parameter has",
                actual=shape,
            )
        )
    return findings


# -- step counters --------------------------------------------------------------------------
def step_counters(state: Mapping[str, Any], layout: Layout) -> dict[str, int]:
    counters: dict[str, int] = {}
    if (v := _as_int(state.get(f"{parts.TRAIN_STATE}.step"))) is not None:
        counters["train_state.step"] = v
    opt_steps = [
        _as_int(v) for k, v in _part(state, parts.OPTIMIZER).items() if k.startswith("state.") and k.endswith(".step")
    ]
    known = [s for s in opt_steps if s is not None]
    if known:
        counters["optimizer step"] = max(known)
    group_steps = [
        _as_int(v) for k, v in _part(state, parts.OPTIMIZER).items() if re.match(r"^param_groups\.\d+\.step$", k)
    ]
    group_known = [s for s in group_steps if s is not None]
    if group_steps and len(group_known) == len(group_steps):  # Megatron: the step is kept per param group
        counters["optimizer param_groups step"] = max(group_known)
    if layout.scheduler_per_step and (v := _as_int(state.get(f"{parts.LR_SCHEDULER}.last_epoch"))) is not None:
        counters["lr_scheduler.last_epoch"] = v
    if layout.scheduler_per_step and (v := _as_int(state.get(f"{parts.LR_SCHEDULER}._step_count"))) is not None:
        counters["lr_scheduler._step_count - 1"] = v - 1
    counters.update(layout.step_counters)
    return counters


def check_steps(state: Mapping[str, Any], layout: Layout) -> tuple[list[Finding], dict[str, Any]]:
    counters = step_counters(state, layout)
    if len(set(counters.values())) <= 1:
        return [], {"step_counters": counters}
    reference = counters.get("train_state.step", max(counters.values()))
    odd = {k: v for k, v in counters.items() if v != reference}
    listing = ", ".join(f"{k}={v}" for k, v in counters.items())
    what = []
    if any(k.startswith("lr_scheduler") for k in odd):
        what.append(
            "the learning-rate schedule would resume off by "
            + ", ".join(str(v - reference) for k, v in odd.items() if k.startswith("lr_scheduler"))
            + " step(s)"
        )
    if "optimizer step" in odd:
        what.append("AdamW bias correction would use the wrong step")
    if any(k in odd for k in ("directory name", "file name", "trainer_state.json global_step")):
        what.append("the checkpoint is not the step its name says")
    return [
        _f(
            "step-mismatch",
            ", ".join(sorted(odd)),
            f"step counters disagree ({listing}): "
            + ("; ".join(what) or "a resume would not know which step it is at"),
            expected=reference,
            actual=odd,
        )
    ], {"step_counters": counters}


# -- rng ------------------------------------------------------------------------------------
def _generators(rng: Mapping[str, Any]) -> set[str]:
    heads = {k.split(".", 1)[0] for k in rng}
    return {g for g, aliases in GENERATORS.items() if heads & set(aliases)} | ({"cuda"} if "cuda" in heads else set())


def _generator_missing(gen: str, rank: int | None, saved_by_writer: bool = False) -> Finding:
    """torch's generator draws every dropout mask: its state is required. Python's and numpy's
    matter only to a run that draws from them (augmentation, shuffling in a loader) — which
    the checkpoint cannot tell: a warning that says so, unless the writer always saves them
    (then one missing is damage)."""
    required = gen == "torch CPU" or saved_by_writer
    use = (
        " (its writer always saves it)"
        if saved_by_writer and gen != "torch CPU"
        else ""
        if required
        else " (if the run draws from it: data augmentation, a loader shuffling with it)"
    )
    return _f(
        "rng-generator-missing",
        "rng" if rank is None else f"rng.rank_{rank}",
        f"no {gen} generator state"
        + ("" if rank is None else f" for rank {rank}")
        + f": a resume would draw different {gen} random numbers than the original run{use}",
        rank=rank,
        severity=Severity.ERROR if required else Severity.WARNING,
    )


RNGSTATE_MARKS = ("python.version", "python.state", "python.gauss")
"""What :class:`drill.sdk.RNGState` always writes for Python's generator, beside numpy's and
torch's, which it always writes too."""


def _always_saved(entries: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The generators the state's own shape says its writer always saves: :class:`drill.sdk.RNGState`
    (Python's, numpy's and torch's, every time: one missing is damage); None where the shape says nothing."""
    if all(mark in entries for mark in RNGSTATE_MARKS):
        return ("python", "numpy", "torch CPU")
    return None


def _by_rank(rng: Mapping[str, Any]) -> dict[int | None, dict[str, Any]]:
    """The RNG part's entries by the rank that saved them (``rank_N.…``; None: not per rank)."""
    per_rank: dict[int | None, dict[str, Any]] = {}
    for key, value in rng.items():
        head, _, rest = key.partition(".")
        m = _RANKED.match(head)
        if m:
            per_rank.setdefault(int(m.group(1)), {})[rest] = value
        else:
            per_rank.setdefault(None, {})[key] = value
    return per_rank


def check_rng(state: Mapping[str, Any], layout: Layout) -> tuple[list[Finding], dict[str, Any]]:
    rng = _part(state, parts.RNG)
    if not rng:
        return [], {}
    findings: list[Finding] = []
    per_rank = _by_rank(rng)
    evidence: dict[str, Any] = {"ranks": {}}
    cuda_ranks = set()
    for rank, entries in sorted(per_rank.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        have = _generators(entries)
        evidence["ranks"]["all" if rank is None else rank] = sorted(have)
        if "cuda" in have:
            cuda_ranks.add(rank)
        saves = layout.rng_generators if layout.rng_generators is not None else _always_saved(entries)
        for gen in GENERATORS:
            if gen not in have and (saves is None or gen in saves):
                findings.append(_generator_missing(gen, rank, saves is not None))
    if cuda_ranks and len(cuda_ranks) != len(per_rank):
        for rank in sorted((r for r in per_rank if r not in cuda_ranks), key=lambda r: -1 if r is None else r):
            findings.append(
                _f(
                    "rng-generator-missing",
                    f"rng.rank_{rank}.cuda",
                    f"rank {rank} saved no CUDA RNG state while other ranks did",
                    rank=rank,
                )
            )
    ranked = [r for r in per_rank if r is not None]
    if ranked and len(layout.saved_ranks) > 1:
        findings += _ranks_missing(
            "rng",
            "rng-rank-missing",
            layout.saved_ranks,
            ranked,
            "RNG state",
            "would draw different dropout masks and random numbers than the original run",
        )
    saved = layout.rank_files.get(parts.RNG, [])
    if layout.multi_rank:
        upto = max(max(saved) + 1, 2)  # rank-suffixed files exist only when world size > 1
        findings += each_missing(
            absent(saved, upto),
            lambda rank: _f(
                "rng-rank-missing",
                f"rng_state_{rank}.pth",
                f"rank {rank} saved no RNG state (rng_state_{rank}.pth): on resume rank {rank} would draw different "
                "dropout masks and random numbers than the original run, and the run would diverge",
                rank=rank,
                expected=f"rng_state_{rank}.pth",
                actual="missing",
            ),
        )
        evidence["rank_files"] = saved[: PER_CODE - 1]
    return findings, evidence


# -- data loader ----------------------------------------------------------------------------
def check_dataloader(state: Mapping[str, Any], layout: Layout, required: bool) -> tuple[list[Finding], dict[str, Any]]:
    loader = _part(state, parts.DATALOADER)
    if not loader:
        return [], {}
    severity = Severity.ERROR if required else Severity.WARNING
    findings: list[Finding] = []
    ranks = sorted({int(m.group(1)) for k in loader if (m := _RANKED.match(k.split(".", 1)[0]))})
    if ranks and len(layout.saved_ranks) > 1:
        findings += _ranks_missing(
            "dataloader",
            "dataloader-rank-missing",
            [r for r in layout.saved_ranks if r > max(ranks)],
            ranks,
            "data-loader state",
            "would restart its data at epoch start",
        )
    findings += each_missing(
        absent(ranks, max(ranks) + 1 if ranks else 0),
        lambda rank: _f(
            "dataloader-rank-missing",
            f"dataloader.dp_rank_{rank}",
            f"no data-loader state for rank {rank}: on resume rank {rank} would restart its data at epoch start",
            rank=rank,
        ),
    )
    if layout.loader_shuffles is not False and not any(_ORDER_KEYS.search(k) for k in loader):
        # Only a shuffling loader needs more than a position; when the layout cannot say, a warning.
        severity = severity if layout.loader_shuffles else Severity.WARNING
        findings.append(
            _f(
                "dataloader-position-only",
                "dataloader",
                "the data-loader state holds a position but no sampler/shuffle state (seed, generator or order): "
                "a resume would continue at the right count on a differently shuffled stream",
                severity=severity,
            )
        )
    evidence: dict[str, Any] = {"keys": sorted(loader)[:20], "ranks": ranks}
    step = _as_int(state.get(f"{parts.TRAIN_STATE}.step"))
    for where, sub in [("dataloader", loader)] + [(f"dataloader.rank_{r}", _part(loader, f"rank_{r}")) for r in ranks]:
        consumed = _batches_consumed(sub)
        if consumed is None or step is None:
            continue
        evidence.setdefault("batches_consumed", consumed)
        if consumed != step:
            direction = "repeat" if consumed < step else "skip"
            findings.append(
                _f(
                    "dataloader-step-mismatch",
                    where,
                    f"{where} has consumed {consumed} batches but train_state is at step {step}: a resume would "
                    f"{direction} {abs(step - consumed)} batches and train on different data than the original run",
                    expected=step,
                    actual=consumed,
                )
            )
    return findings, evidence


def _ranks_missing(part: str, code: str, expected: list[int], have: list[int], what: str, harm: str) -> list[Finding]:
    """A finding per rank that saved the checkpoint but left no ``part.rank_N`` state."""
    return each_missing(
        absent_from(expected, have),
        lambda rank: _f(
            code,
            f"{part}.rank_{rank}",
            f"rank {rank} saved its shard of the checkpoint but no {what}: on resume rank {rank} {harm}",
            rank=rank,
        ),
    )


def _batches_consumed(loader: Mapping[str, Any]) -> int | None:
    """For loaders that expose epoch/position/batch size/length (as the demo's does)."""
    vals = {k: _as_int(loader.get(k)) for k in ("epoch", "position", "batch_size", "num_windows")}
    if any(v is None for v in vals.values()) or not vals["batch_size"]:
        return None
    per_epoch = vals["num_windows"] // vals["batch_size"]  # type: ignore[operator]
    return vals["epoch"] * per_epoch + vals["position"] // vals["batch_size"]  # type: ignore[operator]


# -- finite scan ----------------------------------------------------------------------------
def _inf_severity(key: str, params: frozenset[str]) -> Severity:
    """±Inf in a parameter or an optimizer moment is damage; in a buffer the optimizer does not
    update (an attention mask is -inf above the diagonal on purpose) it is information."""
    if key.startswith(parts.OPTIMIZER + ".") or key in params:
        return Severity.ERROR
    if key.startswith(parts.MODEL + "."):
        return Severity.INFO if params else Severity.ERROR
    return Severity.WARNING


def check_finite(
    stats: dict[str, list[int]], mode: str, trained: bool, params: frozenset[str] = frozenset()
) -> tuple[list[Finding], dict[str, Any]]:
    if mode == "off":
        return [], {"finite_scan": "off"}
    findings: list[Finding] = []
    for key, (_, nan, inf, zero) in sorted(stats.items()):
        if nan or inf:
            severity = Severity.ERROR if nan else _inf_severity(key, params)
            harm = (
                "a resume would propagate them into every weight within a step"
                if severity is Severity.ERROR
                else "a buffer the optimizer does not update (a mask holds -inf on purpose)"
                if severity is Severity.INFO
                else "not a parameter, but not expected either"
            )
            findings.append(
                _f(
                    "non-finite",
                    key,
                    f"{key} holds {nan} NaN and {inf} Inf values: {harm}",
                    actual={"nan": nan, "inf": inf},
                    severity=severity,
                )
            )
        elif (
            trained
            and zero
            and (key.startswith(parts.MODEL + ".") and key.endswith("weight") or key.endswith("exp_avg_sq"))
        ):
            findings.append(
                _f(
                    "still-zero",
                    key,
                    f"{key} is all zeros although training has run: it was never updated, or was re-initialized on save",
                    severity=Severity.WARNING,
                )
            )
    return findings, {"finite_scan": mode, "elements_scanned": sum(v[0] for v in stats.values())}


def _finite(restore: Any, state: Mapping[str, Any], mode: str) -> dict[str, list[int]]:
    """What the scan found: here, or — after a distributed restore — on the ranks that hold the tensors."""
    if restore.finite is not None:
        return {k: v for k, v in restore.finite.items() if k in state}
    return scan(list(state.items()), mode)


def _trained(state: Mapping[str, Any], layout: Layout) -> bool:
    counters = step_counters(state, layout)
    return bool(counters and max(counters.values()) > 0)


def check_contract(inputs: CheckInputs) -> CheckResult:
    restore, expectations = inputs.restore, inputs.expectations
    assert restore is not None
    layout: Layout | None = restore.layout
    if restore.metadata_error is not None or layout is None:
        return CheckResult(name=NAME, summary="not checked: the checkpoint could not be loaded", skipped=True)
    state = restore.state
    failed = restore.failed_keys
    if failed:  # entries that did not load hold garbage: judge only what was restored
        state = {k: v for k, v in state.items() if k not in failed}
    required = set(expectations.parts_required(layout))
    findings: list[Finding] = []
    evidence: dict[str, Any] = {"format": layout.format}
    for fn in (
        lambda: check_optimizer(state, layout),
        lambda: check_steps(state, layout),
        lambda: check_rng(state, layout),
        lambda: check_dataloader(state, layout, parts.DATALOADER in required),
        lambda: check_finite(
            _finite(restore, state, expectations.finite_scan),
            expectations.finite_scan,
            _trained(state, layout),
            layout.params,
        ),
    ):
        f, ev = fn()
        findings += f
        evidence.update(ev)
    if layout.notes:
        evidence["notes"] = layout.notes
    if layout.recognized:
        evidence["layout"] = layout.recognized
    return CheckResult(
        name=NAME, summary=_summary(findings, evidence, state, layout, restore), findings=findings, evidence=evidence
    )


def _summary(
    findings: list[Finding], evidence: dict[str, Any], state: Mapping[str, Any], layout: Layout, restore: Any
) -> str:
    """What was checked — only that — and why the rest was not."""
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if errors:
        return f"{len(errors)} contract violation(s): " + ", ".join(sorted({f.code for f in errors}))
    counters = evidence.get("step_counters") or step_counters(state, layout)
    have = {p for p in parts.CANONICAL_PARTS if any(k.startswith(p + ".") for k in state)}
    checked = [
        label
        for label, ok in (
            ("optimizer slots", evidence.get("params_checked")),
            ("step counters", len(counters) > 1),
            ("RNG", parts.RNG in have),
            ("data loader", parts.DATALOADER in have),
            ("finite values", evidence.get("elements_scanned")),
        )
        if ok
    ]
    not_loaded = {f.key.split(".", 1)[0] for f in restore.failures}
    gaps = []
    for part, label in ((parts.OPTIMIZER, "optimizer"), (parts.RNG, "RNG"), (parts.DATALOADER, "data loader")):
        if part not in have:
            why = layout.never_saved.get(part) or ("it did not load" if part in not_loaded else "not in the checkpoint")
            gaps.append(f"{label} ({why})")
    step = f" at step {next(iter(counters.values()))}" if counters else ""
    text = f"resume state consistent{step}: " + (", ".join(checked) or "nothing to check")
    return text + (f"; not checked: {'; '.join(gaps)}" if gaps else "")
