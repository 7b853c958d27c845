"""Loading a policy file: YAML → validated :class:`Policy`, or errors naming file, line, field.

Typos must not be ignored: an unknown key is an error (with the closest known key), as is a
value of the wrong type, an invalid cron expression, an unknown selection, or a combination
that contradicts itself.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from drill import parts
from drill.policy.model import (
    SELECTIONS,
    SLO,
    Alerts,
    Checkpoints,
    Contract,
    Integrity,
    Limits,
    Policy,
    Replay,
    Schedule,
    Selection,
)


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


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?$", re.I)
_SIZE_UNITS = {"": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3, "T": 1000**4,
               "KI": 1024, "KIB": 1024, "MI": 1024**2, "MIB": 1024**2, "GI": 1024**3, "GIB": 1024**3, "TIB": 1024**4}  # fmt: skip


def duration(value: Any) -> float:
    """``90``, ``"90s"``, ``"10m"``, ``"2h"``, ``"7d"`` → seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a duration (e.g. 90s, 10m, 2h, 7d)")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}[m.group(2)]


def size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE.match(str(value).strip())
    if not m or (m.group(2) or "").upper() not in _SIZE_UNITS:
        raise ValueError(f"{value!r} is not a size (e.g. 16GiB, 500MB)")
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()])


def cron_trigger(expr: str, timezone: str = "UTC"):  # type: ignore[no-untyped-def]
    """APScheduler trigger for a crontab expression: 5 fields, or 6 with seconds first."""
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) == 6:
        second, minute, hour, day, month, dow = fields
        return CronTrigger(second=second, minute=minute, hour=hour, day=day, month=month, day_of_week=dow, timezone=timezone)
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields (minute hour day month weekday), or 6 with seconds first; got {len(fields)}")
    return CronTrigger.from_crontab(expr, timezone=timezone)


def _cron(value: Any) -> str:
    try:
        cron_trigger(str(value))
    except ValueError as exc:
        raise ValueError(f"invalid cron expression {value!r}: {exc}") from None
    return str(value)


def _timezone(value: Any) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(str(value))
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown timezone {value!r}") from None
    return str(value)


def _parts_list(value: Any) -> tuple[str, ...]:
    items = tuple(str(v) for v in (value if isinstance(value, list) else [value]))
    bad = [p for p in items if p not in parts.CANONICAL_PARTS]
    if bad:
        raise ValueError(f"unknown part(s) {', '.join(bad)} (expected {', '.join(parts.CANONICAL_PARTS)})")
    return items


def _str_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of strings")
    return tuple(value)


def _choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(f"unknown value {value!r} (expected {', '.join(options)})")
        return str(value)

    return check


def _typed(kind: type | tuple[type, ...], name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise ValueError(f"expected {name}, got {value!r}")
        if not isinstance(value, kind):
            raise ValueError(f"expected {name}, got {type(value).__name__} {value!r}")
        return value

    return check


def _positive(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        out = convert(value)
        if out is not None and out <= 0:
            raise ValueError(f"must be positive, got {value!r}")
        return out

    return check


def _number(value: Any) -> float:
    # YAML 1.1 reads 1e-3 (no dot) as a string; accept what Python reads as a float.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number, got {value!r}") from None


STR, INT, BOOL, NUM = _typed(str, "a string"), _typed(int, "an integer"), _typed(bool, "true or false"), _number

# section → {key: converter}; a converter raises ValueError with the reason.
SCHEMA: dict[str, dict[str, Callable[[Any], Any]]] = {
    "checkpoints": {"root": STR, "format": _choice("auto", "dcp", "torch-save", "lightning", "hf-trainer"), "keep_last": _positive(INT)},
    "selection": {"strategy": STR, "step": INT, "window": _positive(duration), "settle": duration, "seed": INT},
    "schedule": {"cron": _cron, "timezone": _timezone, "start_window": _positive(duration)},
    "contract": {"allow_missing": _parts_list, "require": _parts_list, "finite_scan": _choice("full", "sampled", "off"), "allow_classes": _str_list},
    "integrity": {"require_sealed": BOOL, "sample": STR, "coverage_days": _positive(NUM)},
    "replay": {"enabled": BOOL, "entrypoint": STR, "steps": _positive(INT), "rtol": NUM, "atol": NUM, "timeout": _positive(duration)},
    "slo": {"max_restore_seconds": _positive(duration), "max_ttfs_seconds": _positive(duration)},
    "alerts": {"webhook": STR, "command": STR, "timeout": _positive(duration), "retries": INT, "on": _str_list},
    "limits": {"timeout": _positive(duration), "memory": _positive(size)},
}
TOP = {"name": STR, "device": STR, **{k: dict for k in SCHEMA}}
DATACLASSES = {
    "checkpoints": Checkpoints, "selection": Selection, "schedule": Schedule, "contract": Contract, "integrity": Integrity,
    "replay": Replay, "slo": SLO, "alerts": Alerts, "limits": Limits,
}  # fmt: skip


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


def parse_policy(text: str, file: str = "<policy>") -> Policy:
    """Validate a policy document; raises :class:`PolicyError` listing every problem."""
    errors = _Collector(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise PolicyError([Problem(file, mark.line + 1 if mark else None, "", f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from None
    if not isinstance(root, yaml.MappingNode):
        raise PolicyError([Problem(file, None, "", "a policy is a YAML mapping (name:, checkpoints:, schedule:, …)")])
    construct = yaml.SafeLoader("")
    values: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, (knode, vnode) in _mapping(root).items():
        if key not in TOP:
            errors.add(knode, key, _unknown(key, list(TOP)))
            continue
        if key in SCHEMA:
            if not isinstance(vnode, yaml.MappingNode):
                errors.add(vnode, key, "expected a mapping")
                continue
            section: dict[str, Any] = {}
            for sub, (sknode, svnode) in _mapping(vnode).items():
                if sub not in SCHEMA[key]:
                    errors.add(sknode, f"{key}.{sub}", _unknown(sub, list(SCHEMA[key])))
                    continue
                try:
                    section[sub] = SCHEMA[key][sub](construct.construct_object(svnode, deep=True))
                except ValueError as exc:
                    errors.add(svnode, f"{key}.{sub}", str(exc))
            sections[key] = section
            sections[key + "@"] = vnode  # type: ignore[assignment]
        else:
            try:
                values[key] = TOP[key](construct.construct_object(vnode, deep=True))
            except ValueError as exc:
                errors.add(vnode, key, str(exc))

    if "name" not in values and not any(p.field == "name" for p in errors.problems):
        errors.add(root, "name", "required: a name for the policy (one scheduler job per name)")
    elif "name" in values and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", values["name"]):
        errors.add(root, "name", f"{values['name']!r}: use letters, digits, '.', '_' and '-'")
    ck = sections.get("checkpoints", {})
    if "root" not in ck and "checkpoints" not in {p.field.split('.')[0] for p in errors.problems}:
        errors.add(sections.get("checkpoints@") or root, "checkpoints.root", "required: the run directory to drill")  # type: ignore[arg-type]
    if "schedule" in sections and "cron" not in sections["schedule"] and not any(p.field == "schedule.cron" for p in errors.problems):
        errors.add(sections["schedule@"], "schedule.cron", "required: a cron expression, e.g. '0 3 * * *'")  # type: ignore[arg-type]
    _check_selection(sections, errors)
    _check_sample(sections, errors)
    _check_replay(sections, errors)
    _check_device(values, root, errors)
    if errors.problems:
        raise PolicyError(sorted(errors.problems, key=lambda p: (p.line or 0, p.field)))

    built = {k: DATACLASSES[k](**v) for k, v in sections.items() if not k.endswith("@")}
    root_path = built["checkpoints"].root
    if "://" not in root_path and not os.path.isabs(root_path) and file not in ("<policy>",):
        # A relative root is relative to the policy file, so a policy travels with its run.
        built["checkpoints"] = Checkpoints(
            root=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(file)), root_path)),
            format=built["checkpoints"].format,
            keep_last=built["checkpoints"].keep_last,
        )
    return Policy(name=values["name"], device=values.get("device", "auto"), path=file, **built)


def _check_selection(sections: dict[str, Any], errors: _Collector) -> None:
    sel = sections.get("selection")
    if sel is None:
        return
    node = sections["selection@"]
    strategy = sel.get("strategy")
    if strategy is not None and strategy.startswith("step:"):
        num = strategy[5:]
        if not num.isdigit():
            errors.add(node, "selection.strategy", f"{strategy!r}: step must be an integer, as in step:1200")
        elif "step" in sel and sel["step"] != int(num):
            errors.add(node, "selection", f"sets both strategy: {strategy} and step: {sel['step']}")
        else:
            sel["step"] = int(num)
            sel["strategy"] = "step"
    elif strategy is not None and strategy not in SELECTIONS:
        errors.add(node, "selection.strategy", f"unknown selection {strategy!r} (expected {', '.join(SELECTIONS)} or step:N)")
    elif "step" in sel and strategy not in (None, "step"):
        errors.add(node, "selection", f"sets both step: {sel['step']} and strategy: {strategy}; a fixed step is its own selection")
    elif "step" in sel:
        sel["strategy"] = "step"
    if "window" in sel and sel.get("strategy") != "random":
        errors.add(node, "selection.window", "only random selection takes a window")


def _check_sample(sections: dict[str, Any], errors: _Collector) -> None:
    from drill.integrity.sampling import SampleSpecError, parse_sample

    sample = sections.get("integrity", {}).get("sample")
    if sample is not None:
        try:
            parse_sample(sample)
        except SampleSpecError as exc:
            errors.add(sections["integrity@"], "integrity.sample", str(exc))


def _check_replay(sections: dict[str, Any], errors: _Collector) -> None:
    entry = sections.get("replay", {}).get("entrypoint")
    if entry is not None and ":" not in entry:
        errors.add(sections["replay@"], "replay.entrypoint", f"{entry!r} must be module:function")


def _check_device(values: dict[str, Any], root: yaml.Node, errors: _Collector) -> None:
    device = values.get("device")
    if device is not None and not re.match(r"^(auto|cpu|cuda(:\d+)?)$", device):
        errors.add(root, "device", f"unknown device {device!r} (expected auto, cpu, cuda or cuda:N)")


def load_policy(path: str | os.PathLike[str]) -> Policy:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise PolicyError([Problem(path, None, "", f"cannot read: {exc.strerror}")]) from None
    return parse_policy(text, path)
