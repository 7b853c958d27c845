"""Loading a policy file: YAML → validated :class:`Policy`, or errors naming file, line, field.

Typos must not be ignored: an unknown key is an error (with the closest known key), as is a
value of the wrong type, an invalid cron expression, an unknown selection, or a combination
that contradicts itself.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import yaml

from drill import safe_yaml
from drill.device import parse_device
from drill.policy.model import (
    Alerts,
    Allocation,
    Checkpoints,
    Contract,
    FieldError,
    Integrity,
    Limits,
    Policy,
    Replay,
    Schedule,
)
from drill.replay.spec import anchored
from drill.select import Selection
from drill.storage.local import read_regular
from drill.units import decimal, parse_duration, parse_size
from drill.verdict import SLO


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int | None
    field: str
    why: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.why}" if self.field else f"{where}: {self.why}"


class PolicyError(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def _parts_list(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in (value if isinstance(value, list) else [value]))


def _mapping_value(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("expected a mapping")
    return {str(k): v for k, v in value.items()}


def _mapping_list(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError("expected a list of mappings")
    return tuple({str(k): v for k, v in item.items()} for item in value)


def _str_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of strings")
    return tuple(value)


def _typed(kind: type | tuple[type, ...], name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise ValueError(f"expected {name}, got {value!r}")
        if not isinstance(value, kind):
            raise ValueError(f"expected {name}, got {type(value).__name__} {value!r}")
        return value

    return check


def _number(value: Any) -> float:
    # YAML 1.1 reads 1e-3 (no dot) as a string; accept what Python reads as a float.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number, got {value!r}") from None


def _duration(value: Any) -> float:
    return parse_duration(value)


def _size(value: Any) -> int:
    return parse_size(value)


STR, INT, BOOL, NUM = _typed(str, "a string"), _typed(int, "an integer"), _typed(bool, "true or false"), _number

# section → {key: converter}: the value's type and units. What a value may be is the
# dataclass's business (its __post_init__), so the rules live in one place.
SCHEMA: dict[str, dict[str, Callable[[Any], Any]]] = {
    "checkpoints": {"root": STR, "format": STR, "keep_last": INT, "durable": STR, "scratch": STR, "s3": _mapping_value, "cold": BOOL},
    "selection": {"strategy": STR, "step": INT, "window": _duration, "settle": _duration, "seed": INT},
    "schedule": {"cron": STR, "timezone": STR, "start_window": _duration},
    "contract": {"allow_missing": _parts_list, "require": _parts_list, "finite_scan": STR, "allow_classes": _str_list},
    "integrity": {"require_sealed": BOOL, "sample": STR, "coverage_days": NUM, "key_file": STR},
    "replay": {"enabled": BOOL, "entrypoint": STR, "steps": INT, "ranks": INT, "python": STR, "rtol": NUM, "atol": NUM, "timeout": _duration},
    "slo": {"max_restore_seconds": _duration, "max_ttfs_seconds": _duration},
    "alerts": {"webhook": STR, "command": STR, "timeout": _duration, "retries": INT, "on": _str_list},
    "limits": {"timeout": _duration, "memory": _size},
    "allocation": {
        "launcher": STR, "nodes": INT, "ranks_per_node": INT, "gpus_per_node": INT, "partition": STR, "account": STR,
        "time_limit": _duration, "queue_timeout": _duration, "rendezvous": STR, "log_dir": STR, "sbatch_args": _str_list, "image": STR, "namespace": STR,
        "volume_claim": STR, "host_path": STR, "s3_secret": STR, "database_secret": STR, "cpu": NUM, "memory": _size, "run_as_user": INT,
        "node_selector": _mapping_value, "tolerations": _mapping_list, "gpu_resource": STR,
    },
}  # fmt: skip


def _device(value: Any) -> str:
    return parse_device(STR(value))


TOP = {"name": STR, "device": _device, **{k: dict for k in SCHEMA}}
DATACLASSES = {
    "checkpoints": Checkpoints, "selection": Selection, "schedule": Schedule, "contract": Contract, "integrity": Integrity,
    "replay": Replay, "slo": SLO, "alerts": Alerts, "limits": Limits, "allocation": Allocation,
}  # fmt: skip
REQUIRED = {
    "checkpoints": ("root", "the run directory to drill"),
    "schedule": ("cron", "a cron expression, e.g. '0 3 * * *'"),
}


class _Collector:
    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []

    def add(self, node: yaml.Node | None, field: str, why: str) -> None:
        self.problems.append(Problem(self.file, node.start_mark.line + 1 if node is not None else None, field, why))


def _unknown(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f"unknown key{f' (did you mean {close[0]!r}?)' if close else ''}; expected one of {', '.join(known)}"


def _mapping(node: yaml.Node) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    return {k.value: (k, v) for k, v in node.value}


@dataclass(slots=True)
class _Section:
    node: yaml.Node
    values: dict[str, Any]
    nodes: dict[str, yaml.Node]


MAX_BYTES = 1 << 20
"""A policy is a page of settings; a larger file is refused before it is parsed."""
MAX_DEPTH = 32
"""Nesting deeper than any policy needs (a policy nests three levels) is refused as it is read,
long before Python's recursion limit."""
MAX_NODES = 10_000
"""Values in the document once every alias is expanded: a few anchors that multiply (the
"billion laughs") are refused before anything is built from them."""


def _compose(text: str, file: str) -> yaml.Node | None:
    """The document's node graph, within the limits above; a :class:`PolicyError` naming the
    line otherwise."""
    if len(text) > MAX_BYTES:
        raise PolicyError(
            [Problem(file, None, "", f"{len(text)} characters: larger than any policy ({MAX_BYTES} at most)")]
        )
    try:
        return safe_yaml.compose(text, max_depth=MAX_DEPTH, max_nodes=MAX_NODES)
    except safe_yaml.YamlRefused as exc:
        raise PolicyError([Problem(file, exc.line, "", exc.why)]) from None


def parse_policy(text: str, file: str = "<policy>") -> Policy:
    """Validate a policy document; raises :class:`PolicyError` listing every problem."""
    errors = _Collector(file)
    root = _compose(text, file)
    if not isinstance(root, yaml.MappingNode):
        raise PolicyError([Problem(file, None, "", "a policy is a YAML mapping (name:, checkpoints:, schedule:, …)")])
    values, sections = _read(root, errors)
    if "name" not in values and not any(p.field == "name" for p in errors.problems):
        errors.add(root, "name", "required: a name for the policy (one scheduler job per name)")
    if "checkpoints" not in sections and not any(p.field.startswith("checkpoints") for p in errors.problems):
        errors.add(root, "checkpoints.root", "required: the run directory to drill")
    _selection_shorthand(sections.get("selection"), errors)
    built = {name: obj for name, sec in sections.items() if (obj := _build(name, sec, errors)) is not None}
    if errors.problems:
        raise PolicyError(sorted(errors.problems, key=lambda p: (p.line or 0, p.field)))
    built["checkpoints"] = _relative_root(built["checkpoints"], file)
    if "replay" in built and file != "<policy>":  # a file entrypoint and an interpreter travel with their policy
        here, replay = os.path.dirname(os.path.abspath(file)), built["replay"]
        built["replay"] = replace(
            replay,
            entrypoint=replay.entrypoint and anchored(replay.entrypoint, here),
            python=replay.python and os.path.join(here, os.path.expanduser(replay.python)),
        )
    try:
        path = file if file == "<policy>" else os.path.abspath(file)  # a re-run, a batch job's --chdir: the same file
        return Policy(name=values["name"], device=values.get("device", "auto"), path=path, source=text, **built)
    except FieldError as exc:
        errors.add(root, exc.field, str(exc))
        raise PolicyError(errors.problems) from None


def _read(root: yaml.MappingNode, errors: _Collector) -> tuple[dict[str, Any], dict[str, _Section]]:
    """Top-level values and sections, each value converted to its type and units."""
    construct = yaml.SafeLoader("")
    values: dict[str, Any] = {}
    sections: dict[str, _Section] = {}
    for key, (knode, vnode) in _mapping(root).items():
        if key not in TOP:
            errors.add(knode, key, _unknown(key, list(TOP)))
        elif key not in SCHEMA:
            try:
                values[key] = TOP[key](_construct(construct, vnode))
            except ValueError as exc:
                errors.add(vnode, key, str(exc))
        elif not isinstance(vnode, yaml.MappingNode):
            errors.add(vnode, key, "expected a mapping")
        else:
            section = sections[key] = _Section(vnode, {}, {})
            for sub, (sknode, svnode) in _mapping(vnode).items():
                if sub not in SCHEMA[key]:
                    errors.add(sknode, f"{key}.{sub}", _unknown(sub, list(SCHEMA[key])))
                    continue
                section.nodes[sub] = svnode
                try:
                    section.values[sub] = SCHEMA[key][sub](_construct(construct, svnode))
                except ValueError as exc:
                    errors.add(svnode, f"{key}.{sub}", str(exc))
    return values, sections


def _construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """The plain value of ``node``; a tag the safe loader will not build (``!!python/object``,
    any local tag) is a ``ValueError`` naming it — never an object."""
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise ValueError(
            f"{getattr(exc, 'problem', None) or exc}: a policy holds plain values only (strings, numbers, lists, mappings)"
        ) from None


def _selection_shorthand(sel: _Section | None, errors: _Collector) -> None:
    """``strategy: step:1200`` means ``step: 1200``."""
    if sel is None:
        return
    strategy = sel.values.get("strategy")
    if isinstance(strategy, str) and strategy.startswith("step:"):
        num = decimal(strategy[5:])
        if num is None:
            errors.add(
                sel.nodes["strategy"], "selection.strategy", f"{strategy!r}: step must be an integer, as in step:1200"
            )
        elif "step" in sel.values and sel.values["step"] != num:
            errors.add(sel.node, "selection", f"sets both strategy: {strategy} and step: {sel.values['step']}")
        else:
            sel.values.update(strategy="step", step=num)
    elif "step" in sel.values and strategy is None:
        sel.values["strategy"] = "step"


def _build(name: str, sec: _Section, errors: _Collector) -> Any:
    if any(p.field.startswith(f"{name}.") for p in errors.problems):
        return None
    required = REQUIRED.get(name)
    if required is not None and required[0] not in sec.values:
        errors.add(sec.node, f"{name}.{required[0]}", f"required: {required[1]}")
        return None
    values = dict(sec.values)
    for _ in range(len(values) + 1):  # report every bad field, not only the first
        try:
            return DATACLASSES[name](**values)
        except ValueError as exc:
            field = getattr(exc, "field", None)
            errors.add(
                sec.nodes.get(field, sec.node) if field else sec.node, f"{name}.{field}" if field else name, str(exc)
            )
            if field not in values:
                return None
            del values[field]
        except TypeError:  # a required field was the bad one: nothing more to learn
            return None
    return None


def _relative_root(ck: Checkpoints, file: str) -> Checkpoints:
    """A relative root is relative to the policy file, so a policy travels with its run."""
    if "://" in ck.root or os.path.isabs(ck.root) or file == "<policy>":
        return ck
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(file)), ck.root))
    return replace(ck, root=root)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    path = os.fspath(path)
    try:
        text = read_regular(path, MAX_BYTES).decode("utf-8")  # never a FIFO or /dev/zero
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PolicyError([Problem(path, None, "", f"cannot read: {getattr(exc, 'strerror', None) or exc}")]) from None
    return parse_policy(text, path)
