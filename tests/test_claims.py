"""One meaning per claim (drill.claims): coverage is bytes proven over bytes retained on storage,
a pass carries its evidence, last-good says how good, a verify that proves nothing is not a pass
— and every view (run, verify, the SDK, show, history, report, metrics) says the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import drill, invoke
from tests.support.faults import FaultyStorage, Flip


def _files_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file() and p.name != "drill-manifest.json")


def test_coverage_is_bytes_proven_over_bytes_on_storage_naming_what_was_never_drilled(
    demo_run: Path, sqlite_url: str, tmp_path: Path
) -> None:
    """One checkpoint of three drilled: 1/3 of the checkpoints and of the bytes — in the report
    and the metrics alike — and the other two are named."""
    assert drill(demo_run, sqlite_url).status.value == "passed"
    doc = json.loads(invoke(CliRunner(), "report", "-f", "json", "--db", sqlite_url).stdout)
    (run,) = doc["runs"]
    cover = run["coverage"]
    on_storage = sum(_files_bytes(demo_run / f"step-{s}") for s in (10, 20, 30))
    assert (
        cover["retained"] == 3 and cover["drilled_in_window"] == 1 and cover["never_drilled"] == ["step-10", "step-20"]
    )
    assert cover["bytes_retained"] == on_storage
    assert cover["bytes_verified_in_window"] == _files_bytes(demo_run / "step-30")
    assert (
        cover["share_bytes"] == pytest.approx(cover["bytes_verified_in_window"] / on_storage)
        and cover["share_bytes"] < 0.5
    )
    prom = tmp_path / "drill.prom"
    assert invoke(CliRunner(), "metrics", "--textfile", str(prom), "--db", sqlite_url).exit_code == 0
    ratio = next(line for line in prom.read_text().splitlines() if line.startswith("drill_verified_bytes_ratio{"))
    assert float(ratio.rsplit(" ", 1)[1]) == pytest.approx(cover["share_bytes"])
    md = invoke(CliRunner(), "report", "-f", "md", "--db", sqlite_url).stdout
    assert "never drilled: step-10, step-20" in md


def test_a_verify_that_proves_nothing_is_unproven_exit_8_never_passed(tmp_path: Path) -> None:
    ckpt = tmp_path / "run" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    res = invoke(CliRunner(), "verify", str(ckpt), "--json", "--db", f"sqlite:///{tmp_path / 'd.db'}")
    assert res.exit_code == 8, (res.exit_code, res.stderr)
    doc = json.loads(res.stdout)
    assert doc["status"] == "unproven" and doc["evidence_level"] == "none" and doc["exit_code"] == 8
    assert "unproven" in invoke(CliRunner(), "verify", str(ckpt), "--db", f"sqlite:///{tmp_path / 'd.db'}").stderr


def test_a_pass_carries_its_evidence_everywhere_it_is_shown(demo_run: Path, sqlite_url: str) -> None:
    from drill.checks import Expectations

    (demo_run / "step-30" / "drill-manifest.json").unlink()
    outcome = drill(demo_run, sqlite_url, expectations=Expectations(allow_missing=("rng",)))
    assert outcome.status.value == "passed" and outcome.evidence_level == "structural"
    runner = CliRunner()
    shown = invoke(runner, "show", str(outcome.id), "--db", sqlite_url).stdout
    assert (
        "structurally consistent, no content hashes" in shown
        and "replay not run" in shown
        and "accepted missing: rng" in shown
    )
    listed = invoke(runner, "history", "--db", sqlite_url).stdout
    assert "structural" in listed
    doc = json.loads(invoke(runner, "show", str(outcome.id), "--json", "--db", sqlite_url).stdout)
    assert doc["evidence_level"] == "structural" and doc["proof"]["allowed_missing"] == ["rng"]


def test_last_good_says_how_good_and_holds_to_a_minimum_evidence(demo_run: Path, sqlite_url: str) -> None:
    (demo_run / "step-30" / "drill-manifest.json").unlink()
    assert drill(demo_run, sqlite_url, "step:20").status.value == "passed"  # sealed
    assert drill(demo_run, sqlite_url).status.value == "passed"  # step-30, structural only
    runner = CliRunner()
    default = invoke(runner, "last-good", "--root", str(demo_run), "--json", "--db", sqlite_url)
    doc = json.loads(default.stdout)
    assert (
        doc["checkpoint"]["name"] == "step-30"
        and doc["proof"]["evidence"] == "structural"
        and doc["proof"]["replay"] == "not run"
    )
    sealed = invoke(runner, "last-good", "--root", str(demo_run), "--min-evidence", "sealed", "--db", sqlite_url)
    assert sealed.exit_code == 0 and sealed.stdout.strip().endswith("step-20")
    assert "sealed" in sealed.stderr  # what it relied on, said to the person
    none = invoke(runner, "last-good", "--root", str(demo_run), "--min-evidence", "authenticated", "--db", sqlite_url)
    assert none.exit_code == 3
    assert (
        invoke(runner, "last-good", "--root", str(demo_run), "--min-evidence", "bogus", "--db", sqlite_url).exit_code
        == 2
    )


def test_the_sdk_never_falls_back_to_a_checkpoint_whose_latest_drill_failed(demo_run: Path, sqlite_url: str) -> None:
    """step-30's drill failed (a byte flipped in flight); its bytes on disk verify now, but a
    failed drill is not a place to resume from: the newest never-drilled one that proves out is."""
    from drill import sdk

    flipped = drill(demo_run, sqlite_url, storage=FaultyStorage({"__0_0.distcp": Flip(offset=4096)}))
    assert flipped.status.value == "failed"
    assert Path(sdk.last_good(str(demo_run), db=sqlite_url)).name == "step-20"


def _plain_model_and_optimizer():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def test_the_commonest_dcp_save_raises_no_false_alarm(tmp_path: Path, sqlite_url: str) -> None:
    """``dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()})``: the optimizer
    keeps torch.optim's indices, every parameter is in its one group — no param-not-optimized."""
    import warnings

    import torch.distributed.checkpoint as dcp

    model, opt = _plain_model_and_optimizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id=str(tmp_path / "run" / "step-1")
        )
    outcome = drill(tmp_path / "run", sqlite_url)
    codes = {f.code for f in outcome.findings}
    assert "param-not-optimized" not in codes and "optimizer-slot-missing" not in codes, sorted(codes)
    opt_state = {k: v for k, v in opt.state_dict().items()}
    opt_state["param_groups"] = [
        {**opt_state["param_groups"][0], "params": opt_state["param_groups"][0]["params"][:2]}
    ]  # two of four
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "optimizer": opt_state}, checkpoint_id=str(tmp_path / "run2" / "step-1"))
    partial = drill(tmp_path / "run2", sqlite_url)
    assert [f.code for f in partial.findings if f.code == "param-not-optimized"] == ["param-not-optimized"]


def test_a_bare_rng_state_in_a_torch_save_file_is_the_torch_generator(tmp_path: Path, sqlite_url: str) -> None:
    """``torch.save({..., "rng": torch.get_rng_state()})``: keys and contract agree that the
    RNG is there; generators the run may never draw from are warnings, not failures."""
    import torch

    model, opt = _plain_model_and_optimizer()
    (tmp_path / "run").mkdir()
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "step": 1},
        tmp_path / "run" / "ckpt_step_1.pt",
    )
    outcome = drill(tmp_path / "run", sqlite_url)
    contract = outcome.check("contract")
    assert contract is not None and "RNG" in contract.summary and "not checked: RNG" not in contract.summary
    assert all(f.severity.value == "warning" for f in outcome.findings if f.code == "rng-generator-missing")
    assert outcome.status.value == "passed", outcome.message


def test_parameters_never_updated_are_frozen_not_damaged(demo_run: Path, sqlite_url: str) -> None:
    """A LoRA run's base weights sit in the param groups with no optimizer state at all: never
    updated, as frozen parameters are — a note, not 63 false ``optimizer-slot-missing`` errors.
    A parameter with part of its state is still damage."""
    from tests.test_formats import rewrite_dcp

    rewrite_dcp(
        demo_run / "step-30", lambda s: [s.pop(k) for k in [k for k in s if k.startswith("optimizer.state.blocks.0.")]]
    )
    outcome = drill(demo_run, sqlite_url)
    contract = outcome.check("contract")
    assert outcome.status == "passed", [f.to_dict() for f in outcome.findings]
    (note,) = [f for f in contract.findings if f.code == "param-never-updated"]
    assert note.severity.value == "info" and "blocks.0." in note.message
    rewrite_dcp(demo_run / "step-30", lambda s: s.pop("optimizer.state.head.weight.exp_avg"))
    outcome = drill(demo_run, sqlite_url)
    assert outcome.status == "failed" and "optimizer-slot-missing" in [f.code for f in outcome.findings]


def test_one_parameter_without_state_beside_its_modules_others_lost_it(demo_run: Path, sqlite_url: str) -> None:
    """Freezing is done module by module: ``blocks.1.attn.qkv.weight`` with no state while
    ``blocks.1.attn.qkv.bias`` has its moments is a lost state, every slot named — not frozen."""
    from tests.test_formats import rewrite_dcp

    prefix = "optimizer.state.blocks.1.attn.qkv.weight."
    rewrite_dcp(demo_run / "step-30", lambda s: [s.pop(k) for k in [k for k in s if k.startswith(prefix)]])
    outcome = drill(demo_run, sqlite_url)
    missing = {f.subject for f in outcome.findings if f.code == "optimizer-slot-missing"}
    assert outcome.status == "failed" and f"{prefix}exp_avg" in missing and f"{prefix}exp_avg_sq" in missing
    assert "param-never-updated" not in [f.code for f in outcome.findings]
