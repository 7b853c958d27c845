"""Policy files: every shipped one loads; every mistake is caught with file, line and field."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drill.checkpoints import CheckpointRef, Discovery
from drill.errors import NothingToDrill
from drill.policy import PolicyError, load_policy
from drill.policy.load import parse_policy
from drill.select import Selection, choose
from tests.conftest import invoke

POLICIES = sorted((Path(__file__).resolve().parent.parent / "policies").glob("*.yaml"))
BASE = "name: p\ncheckpoints: {root: /r}\n"


def test_the_shipped_policies_all_load() -> None:
    assert {p.stem for p in POLICIES} >= {"demo", "torchtitan", "hf-trainer", "s3"}
    for path in POLICIES:
        policy = load_policy(path)
        assert policy.schedule is not None and policy.name


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return [str(p) for p in info.value.problems]


def test_invalid_cron_names_file_line_and_field() -> None:
    (problem,) = _problems(BASE + "schedule:\n  cron: '61 * * * *'\n")
    assert problem.startswith("p.yaml:4: schedule.cron: invalid cron expression '61 * * * *'")


def test_unknown_selection() -> None:
    (problem,) = _problems(BASE + "selection: {strategy: newest}\n")
    assert "p.yaml:3: selection.strategy: unknown selection 'newest'" in problem


def test_typos_are_not_ignored() -> None:
    problems = _problems("name: p\ncheckpoints:\n  root: /r\n  keep_lst: 3\nshedule: {cron: '0 3 * * *'}\n")
    assert problems == [
        "p.yaml:4: checkpoints.keep_lst: unknown key (did you mean 'keep_last'?); expected one of root, format, keep_last, durable, scratch, s3, cold",
        "p.yaml:5: shedule: unknown key (did you mean 'schedule'?); expected one of name, device, checkpoints, "
        "selection, schedule, contract, integrity, replay, slo, alerts, limits, allocation",
    ]


@pytest.mark.parametrize("num", ["\u00b2", "\u0663", "-1", "1e3", ""])
def test_a_step_strategy_is_written_in_ascii_digits(num: str) -> None:
    """``strategy: step:²`` was an internal ``ValueError`` (``str.isdigit`` admits "²"); "٣"
    was step 3. One problem naming the field, as for any step that is no integer."""
    problems = _problems(BASE + f"selection: {{strategy: 'step:{num}'}}\n")
    assert len(problems) == 1 and "step must be an integer, as in step:1200" in problems[0], problems


def test_decimal_reads_ascii_digits_only() -> None:
    from drill.units import decimal

    assert [decimal(t) for t in ("0", "0042", "9" * 30)] == [0, 42, int("9" * 30)]
    assert [decimal(t) for t in ("", "\u00b2", "\u2460", "\u0663", "-1", "+1", " 1", "1_0", "9" * 5000)] == [None] * 9


def test_step_and_latest_together() -> None:
    assert (
        "sets both step: 1200 and strategy: latest"
        in _problems(BASE + "selection: {strategy: latest, step: 1200}\n")[0]
    )
    assert "sets both strategy: step:5 and step: 6" in _problems(BASE + "selection: {strategy: 'step:5', step: 6}\n")[0]
    assert parse_policy(BASE + "selection: {strategy: 'step:5'}\n").selection == Selection(strategy="step", step=5)


def test_missing_root_and_name() -> None:
    problems = _problems("checkpoints: {format: dcp}\n")
    assert any("name: required" in p for p in problems)
    assert any("checkpoints.root: required" in p for p in problems)


def test_values_are_checked() -> None:
    problems = _problems(
        BASE + "limits: {timeout: soon, memory: lots}\nreplay: {steps: 0, entrypoint: nocolon}\ndevice: tpu\n"
    )
    assert any("limits.timeout: 'soon' is not a duration" in p for p in problems)
    assert any("limits.memory: 'lots' is not a size" in p for p in problems)
    assert any("replay.steps: must be at least 1" in p for p in problems)
    assert any("replay.entrypoint: 'nocolon' must be module:function" in p for p in problems)
    assert any("device: unknown device 'tpu'" in p for p in problems)


@pytest.mark.parametrize(
    ("field", "uri", "says"),
    [
        ("root", "gs://bucket/run7", "unsupported storage scheme 'gs'"),
        ("root", "s3://", "names no bucket"),
        ("durable", "s3:///run7", "names no bucket"),
        ("durable", "hdfs://nn/run7", "unsupported storage scheme 'hdfs'"),
    ],
)
def test_a_location_no_storage_can_address_is_a_policy_error_not_a_warning(field: str, uri: str, says: str) -> None:
    """No host could run it: an error naming the field, where a root not mounted *here* is
    only ``policy check``'s warning."""
    root = uri if field == "root" else "/r"
    durable = f"\n  durable: '{uri}'" if field == "durable" else ""
    (problem,) = _problems(f"name: p\ncheckpoints:\n  root: '{root}'{durable}\n")
    assert f"checkpoints.{field}: " in problem and says in problem, problem


def test_not_yaml() -> None:
    (problem,) = _problems("name: [unclosed\n")
    assert problem.startswith("p.yaml:2: not valid YAML")


def test_relative_root_is_relative_to_the_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "p.yaml"
    path.parent.mkdir()
    path.write_text("name: p\ncheckpoints: {root: ../run}\n")
    assert load_policy(path).checkpoints.root == str(tmp_path / "run")


def test_policy_check_command(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "schedule: {cron: 'every night'}\n")
    res = invoke(CliRunner(), "policy", "check", *map(str, POLICIES), str(bad))
    assert res.exit_code == 2
    assert res.stdout.count("ok: ") == len(POLICIES)
    errors = [line for line in res.stderr.splitlines() if not line.startswith("warning: ")]
    assert errors == [
        f"{bad}:3: schedule.cron: invalid cron expression 'every night': Error validating expression 'every night'"
    ] or (len(errors) == 1 and errors[0].startswith(f"{bad}:3: schedule.cron: invalid cron expression 'every night'"))
    # valid policies meant for other hosts: their storage, devices and secrets are not here
    assert "warning: " in res.stderr and "s3" in res.stderr


# -- selection is a pure function -----------------------------------------------------------
NOW = 1_000_000.0


def _disc(*steps: int, age: float = 3600.0) -> Discovery:
    return Discovery(
        root="/r", checkpoints=[CheckpointRef(f"/r/step-{s}", f"step-{s}", s, "dcp", NOW - age) for s in steps]
    )


def test_selection_skips_young_saves_and_what_retention_purges_next() -> None:
    d = _disc(10, 20, 30)
    d.checkpoints.append(CheckpointRef("/r/step-40", "step-40", 40, "dcp", NOW - 5))
    choice = choose(d, Selection(strategy="oldest", settle=60), now=NOW, keep_last=3)
    # step-40 is settling; of 10/20/30, keep-last-3 purges step-10 at the next save
    assert choice.ref.step == 20 and "step-10: keep-last-3 retention purges it next" in choice.reason
    assert "step-40: saved 5 s ago" in choice.reason
    assert choose(d, Selection(strategy="latest", settle=60), now=NOW, keep_last=3).ref.step == 30


def test_least_recently_drilled_covers_every_retained_checkpoint() -> None:
    d = _disc(10, 20, 30, 40)
    drilled: dict[str, datetime] = {}
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    seen = []
    for night in range(6):
        ref = choose(d, Selection(strategy="least-recently-drilled"), now=NOW, keep_last=4, last_drilled=drilled).ref
        drilled[ref.uri] = t + timedelta(days=night)
        seen.append(ref.step)
    assert set(seen[:3]) == {20, 30, 40} and seen[3:] == seen[:3]  # step-10 is next to go


def test_random_is_reproducible_from_its_recorded_seed() -> None:
    d = _disc(10, 20, 30, 40, 50)
    first = choose(d, Selection(strategy="random"), now=NOW)
    assert first.seed is not None and f"seed {first.seed}" in first.reason
    again = choose(d, Selection(strategy="random"), now=NOW, seed=first.seed)
    assert again.ref == first.ref


def test_random_window_and_fixed_step() -> None:
    d = _disc(10, 20)
    d.checkpoints.append(CheckpointRef("/r/step-30", "step-30", 30, "dcp", NOW - 100))
    assert choose(d, Selection(strategy="random", window=600, seed=1), now=NOW).ref.step == 30
    assert choose(d, Selection(strategy="step", step=10), now=NOW, keep_last=2).ref.step == 10
    with pytest.raises(NothingToDrill):
        choose(d, Selection(strategy="step", step=99), now=NOW)
    with pytest.raises(NothingToDrill, match="no eligible checkpoint"):
        choose(_disc(10, age=1), Selection(strategy="latest", settle=60), now=NOW)


HOSTILE = {
    "an alias bomb": "name: b\na: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "checkpoints: {root: /r}\nschedule: {cron: '0 3 * * *'}\ncontract: {allow_missing: *f}\n",
    "deep nesting": "name: d\ncheckpoints: {root: /r}\nschedule: {cron: '0 3 * * *'}\nreplay: "
    + "[" * 20000
    + "]" * 20000
    + "\n",
    "deep mappings": "name: d\ncheckpoints: {root: /r}\nschedule: {cron: '0 3 * * *'}\nalerts: "
    + "{a: " * 5000
    + "1"
    + "}" * 5000
    + "\n",
    "a recursive alias": "name: r\ncheckpoints: &r {root: /r, s3: *r}\nschedule: {cron: '0 3 * * *'}\n",
    "an object tag in a value": "name: t\ncheckpoints: {root: !!python/object/apply:os.system [id]}\nschedule: {cron: '0 3 * * *'}\n",
    "a local tag": "name: t\ncheckpoints: {root: !mytag /r}\nschedule: {cron: '0 3 * * *'}\n",
    "a python name tag at the top": "name: !!python/name:os.system\ncheckpoints: {root: /r}\nschedule: {cron: '0 3 * * *'}\n",
    "a huge file": "name: big\n# " + "x" * (2 << 20) + "\ncheckpoints: {root: /r}\nschedule: {cron: '0 3 * * *'}\n",
}


@pytest.mark.parametrize("what", list(HOSTILE))
@pytest.mark.slow
def test_a_hostile_policy_is_a_policy_error_with_its_line_fast_and_small(what: str, tmp_path: Path) -> None:
    """Every hostile document is refused as a policy error (exit 2, file and line where known)
    by ``policy check`` and ``run --policy`` alike — never a MemoryError, RecursionError or
    internal error (70), and within a few seconds."""
    import resource
    import subprocess
    import sys
    import time

    path = tmp_path / "hostile.yaml"
    path.write_text(HOSTILE[what])
    drill = str(Path(sys.executable).parent / "drill")
    for args in (
        ["policy", "check", str(path)],
        ["run", "--policy", str(path), "--db", f"sqlite:///{tmp_path / 'd.db'}"],
    ):
        started = time.monotonic()
        done = subprocess.run(
            [drill, *args], capture_output=True, text=True, timeout=60,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31)),  # 2 GiB: a bomb would hit it
        )  # fmt: skip
        assert done.returncode == 2, (what, args[0], done.returncode, done.stderr[-800:])
        assert "hostile.yaml" in done.stderr and "internal error" not in done.stderr and "Traceback" not in done.stderr
        assert time.monotonic() - started < 15
