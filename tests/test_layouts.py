"""Checkpoints laid out as torchtitan, Megatron-core (torch_dist) and Lightning FSDP write them,
by 1 and 2 real CPU ranks (see tests/support/layouts.py): clean ones pass with at most a warning for
state the layout never saves; damage in each is found and named."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from drill import DrillOutcome
from drill.verifier import verify_checkpoint
from tests.conftest import drill as _drill
from tests.support import layouts

pytestmark = pytest.mark.slow  # every layout is written by real ranks first

KINDS = ("torchtitan", "megatron", "lightning")
DIRS = {"torchtitan": "step-2", "megatron": "iter_0000030", "lightning": "epoch=0-step=2.ckpt"}
RECOGNISED = {"torchtitan": "torchtitan", "megatron": "Megatron torch_dist", "lightning": "Lightning FSDP sharded"}
NEVER_SAVED = {"torchtitan": "rng", "megatron": "dataloader", "lightning": "rng"}


def _needs(kind: str) -> None:
    if kind == "megatron" and importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed: no real dist_checkpointing save to drill")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    """``written(kind, ranks, nan=False)``: a checkpoint run written once per module — the
    clean run and its copy with a NaN by the same writers (their start-up is most of the time)."""
    cache: dict[tuple[str, int, bool], Path] = {}

    def get(kind: str, ranks: int, nan: bool = False) -> Path:
        _needs(kind)
        if (kind, ranks, nan) not in cache:
            clean, poisoned = (tmp_path_factory.mktemp(f"{kind}{ranks}{tail}") for tail in ("", "nan"))
            layouts.spawn(kind, clean, ranks, nan_out=poisoned)
            cache[kind, ranks, False], cache[kind, ranks, True] = clean, poisoned
        return cache[kind, ranks, nan]

    return get


@pytest.fixture
def copy_of(written, tmp_path: Path):
    def get(kind: str, ranks: int = 2) -> Path:
        return Path(shutil.copytree(written(kind, ranks), tmp_path / kind))

    return get


def _errors(outcome: DrillOutcome) -> list[tuple[str, str, str | None]]:
    return [(f.check, f.code, f.subject) for f in outcome.findings if f.severity.value == "error"]


def _check(outcome: DrillOutcome, name: str):
    return next(c for c in outcome.checks if c.name == name)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_clean_checkpoint_passes_with_at_most_a_warning_for_what_the_layout_never_saves(
    written, kind: str, ranks: int, sqlite_url: str
) -> None:
    outcome = _drill(written(kind, ranks), sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    keys = _check(outcome, "keys")
    assert keys.evidence["layout"].startswith(RECOGNISED[kind] + ":")
    assert {"model", "optimizer", "lr_scheduler", "train_state"} <= set(keys.evidence["tensors"]) | set(
        keys.evidence.get("parts", {})
    )
    warned = {(f.code, f.subject) for f in outcome.findings if f.severity.value == "warning"}
    assert ("part-not-saved-by-layout", NEVER_SAVED[kind]) in warned
    contract = _check(outcome, "contract")
    assert "not checked:" in contract.summary and "finite values" in contract.summary
    files = _check(outcome, "files")
    on_disk = {p.name for p in (written(kind, ranks) / DIRS[kind]).iterdir()}
    assert {f["path"] for f in files.evidence["files"]} | set(files.evidence["not_read"]) == on_disk


def test_the_model_is_found_by_what_the_optimizer_points_at(written, sqlite_url: str) -> None:
    """torchtitan's weights sit at the top level: they are the model because its optimizer
    state names them; buffers beside them belong to it too."""
    outcome = _drill(written("torchtitan", 2), sqlite_url)
    inventory = {e["key"] for e in _check(outcome, "keys").evidence["inventory"]}
    assert "model.blocks.0.attn.qkv.weight" in inventory
    assert "optimizer.state.blocks.0.attn.qkv.weight.exp_avg" in inventory
    assert not any(k.startswith("blocks.") for k in inventory)


def test_never_saved_part_is_tightened_by_a_policy_requirement(written, sqlite_url: str) -> None:
    from drill.checks import Expectations

    required = ("model", "optimizer", "lr_scheduler", "dataloader", "rng", "train_state")
    outcome = _drill(written("torchtitan", 1), sqlite_url, expectations=Expectations(required_parts=required))
    assert ("keys", "part-missing", "rng") in _errors(outcome)
    quiet = _drill(written("torchtitan", 1), sqlite_url, expectations=Expectations(allow_missing=("rng",)))
    assert quiet.status == "passed" and not any(f.subject == "rng" for f in quiet.findings)


def test_megatron_rng_and_common_pt_are_read(written, sqlite_url: str) -> None:
    outcome = _drill(written("megatron", 2), sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert _check(outcome, "keys").evidence["parts"]["rng"] >= 4  # python, numpy, torch state of each rank
    assert "RNG" in _check(outcome, "contract").summary.split("not checked")[0]
    counters = _check(outcome, "contract").evidence["step_counters"]
    assert counters["train_state.step"] == layouts.STEP
    assert "common.pt" in {f["path"] for f in _check(outcome, "files").evidence["files"]}


@pytest.mark.parametrize("kind", KINDS)
def test_nan_in_a_weight_fails_naming_the_tensor(written, kind: str, sqlite_url: str) -> None:
    outcome = _drill(written(kind, 2, nan=True), sqlite_url)
    named = [f.subject for f in outcome.findings if f.code == "non-finite" and f.severity.value == "error"]
    assert outcome.status == "failed"
    assert any(
        s is not None and s.startswith("model.") and s.endswith(layouts.NAN_IN[kind].removeprefix("model."))
        for s in named
    ), named


@pytest.mark.parametrize("kind", KINDS)
def test_deleted_shard_fails_naming_the_file_in_run_and_verify(copy_of, kind: str, sqlite_url: str) -> None:
    run = copy_of(kind)
    os.remove(run / DIRS[kind] / "__1_0.distcp")
    outcome = _drill(run, sqlite_url)
    assert ("files", "file-missing", "__1_0.distcp") in _errors(outcome)
    assert ("integrity", "file-missing", "__1_0.distcp") in _errors(outcome)
    assert "not checked" in _check(outcome, "contract").summary or _check(outcome, "contract").status.value == "failed"
    verified = verify_checkpoint(str(run / DIRS[kind])).result
    assert verified.status.value == _check(outcome, "integrity").status.value == "failed"


def test_corrupted_common_pt_fails_in_run_and_verify(copy_of, sqlite_url: str) -> None:
    run = copy_of("megatron")
    common = run / DIRS["megatron"] / "common.pt"
    data = bytearray(common.read_bytes())
    data[200:260] = bytes(b ^ 0xFF for b in data[200:260])
    common.write_bytes(bytes(data))
    outcome = _drill(run, sqlite_url)
    assert ("integrity", "crc-mismatch", "common.pt") in _errors(outcome)
    assert any(check == "load" and subject == "common.pt" for check, _, subject in _errors(outcome))
    assert verify_checkpoint(str(run / DIRS["megatron"])).result.status.value == "failed"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(("kind", "name"), [("megatron", "common.pt"), ("lightning", "meta.pt")])
def test_a_payload_among_a_side_files_state_is_refused_in_run_and_verify(
    copy_of, kind: str, name: str, tmp_path: Path, sqlite_url: str
) -> None:
    """A side file is read inert, but a payload hidden among its real state (what Megatron's and
    Lightning's own resume, ``torch.load(weights_only=False)``, would run) is refused by name."""
    import torch

    run = copy_of(kind)
    side, marker = run / DIRS[kind] / name, tmp_path / "code-ran"
    state = torch.load(side, weights_only=False)  # the test's own writer's file: trusted
    torch.save({**state, "client_state": _Payload(marker)}, side)
    outcome = _drill(run, sqlite_url)
    errors = _errors(outcome)
    assert ("integrity", "pickle-names-code", name) in errors and ("load", "unsafe-pickle", name) in errors, errors
    refused = next(f for f in outcome.findings if f.code == "unsafe-pickle")
    assert "system, code a trainer's own unpickler would run" in refused.message
    verified = verify_checkpoint(str(run / DIRS[kind]))
    assert [(f.code, f.subject) for f in verified.result.errors] == [("pickle-names-code", name)]
    assert not marker.exists()


@pytest.mark.parametrize(("kind", "name"), [("megatron", "common.pt"), ("lightning", "meta.pt")])
def test_deleted_side_file_fails_naming_it(copy_of, kind: str, name: str, sqlite_url: str) -> None:
    run = copy_of(kind)
    os.remove(run / DIRS[kind] / name)
    outcome = _drill(run, sqlite_url)
    assert ("files", "file-missing", name) in _errors(outcome)
    verified = verify_checkpoint(str(run / DIRS[kind])).result
    assert ("integrity", "file-missing", name) in [(f.check, f.code, f.subject) for f in verified.findings]


def test_megatron_without_metadata_json_is_an_incomplete_save(copy_of, sqlite_url: str) -> None:
    run = copy_of("megatron")
    os.remove(run / DIRS["megatron"] / "metadata.json")
    outcome = _drill(run, sqlite_url)
    assert outcome.status == "failed" and outcome.checkpoint is None
    assert ("resume", "pointer-incomplete", "latest_checkpointed_iteration.txt") in _errors(outcome)
    assert "incomplete save" in verify_checkpoint(str(run / DIRS["megatron"])).result.summary


def test_tracker_file_ahead_of_the_data_fails(copy_of, sqlite_url: str) -> None:
    run = copy_of("megatron")
    (run / "latest_checkpointed_iteration.txt").write_text(str(layouts.STEP + 10))
    outcome = _drill(run, sqlite_url)
    assert ("resume", "pointer-ahead", "latest_checkpointed_iteration.txt") in _errors(outcome)


def test_unreadable_metadata_still_names_a_missing_shard_from_the_listing(
    copy_of, sqlite_url: str, tmp_path: Path
) -> None:
    run = copy_of("megatron")
    ckpt = run / DIRS["megatron"]
    marker = tmp_path / "pwned"
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    os.remove(ckpt / "__1_1.distcp")
    outcome = _drill(run, sqlite_url)
    assert not marker.exists()
    assert ("files", "file-missing", "__1_1.distcp") in _errors(outcome)
    assert ("integrity", "metadata-unreadable", ".metadata") in _errors(outcome)
    verified = [(f.check, f.code, f.subject) for f in verify_checkpoint(str(ckpt)).result.findings]
    assert ("integrity", "file-missing", "__1_1.distcp") in verified


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_planner_classes_in_metadata_load_and_others_need_allow_class(copy_of, sqlite_url: str) -> None:
    """Megatron pickles torch's own SavePlan/WriteItem into .metadata (they load by default); a
    writer's own class is refused with a hint naming it, and --allow-class lets it through in
    both run and verify."""
    run = copy_of("megatron")
    ckpt = run / DIRS["megatron"]
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(ckpt)).read_metadata()
    metadata.planner_data = {"writer": _Writer()}
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    refused = _drill(run, sqlite_url)
    finding = next(f for f in refused.findings if f.code == "metadata-unreadable")
    assert "tests.test_layouts._Writer" in finding.message
    assert not any("may not have finished" in (f.hint or "") for f in refused.findings)
    allowed = _drill(run, sqlite_url, allow_classes=("tests.test_layouts._Writer",))
    assert not any(f.code == "metadata-unreadable" for f in allowed.findings)
    assert verify_checkpoint(str(ckpt), allow_classes=("tests.test_layouts._Writer",)).result.status.value == "passed"
    assert verify_checkpoint(str(ckpt)).result.status.value == "failed"


class _Writer:
    """A writer's own class pickled into .metadata (as older Megatron's MCoreMetadata was)."""


def test_format_lightning_on_a_sharded_ckpt_directory_reads_it_as_dcp(written, sqlite_url: str) -> None:
    outcome = _drill(written("lightning", 2), sqlite_url, format="lightning")
    assert outcome.status == "passed", _errors(outcome)


def test_inf_in_a_buffer_is_information_inf_in_a_weight_is_an_error(written, sqlite_url: str) -> None:
    """Lightning's causal mask is -inf above the diagonal on purpose."""
    outcome = _drill(written("lightning", 1), sqlite_url)
    mask = [f for f in outcome.findings if f.subject and f.subject.endswith("causal_mask")]
    assert mask and all(f.severity.value == "info" for f in mask)


def test_run_and_verify_give_one_verdict_on_every_clean_layout(written) -> None:
    for kind in KINDS:
        if kind == "megatron" and importlib.util.find_spec("megatron.core") is None:
            continue
        result = verify_checkpoint(str(written(kind, 2) / DIRS[kind])).result
        assert result.status.value == "passed", (kind, [f.message for f in result.findings])
        assert json.dumps(result.evidence, default=str)


# -- Lightning's own Trainer with FSDPStrategy(state_dict_type="sharded") on 2 CPU ranks ---------
@pytest.fixture(scope="module")
def real_lightning(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lightning", reason="lightning is not installed: no real Lightning FSDP checkpoint")
    from tests.support import lightning_fsdp

    return lightning_fsdp.spawn(tmp_path_factory.mktemp("plfsdp"), ranks=2)


def test_real_lightning_fsdp_sharded_checkpoint_passes(real_lightning: Path, sqlite_url: str) -> None:
    outcome = _drill(real_lightning, sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert (
        outcome.checkpoint is not None
        and outcome.checkpoint.name == "epoch=0-step=4.ckpt"
        and outcome.checkpoint.step == 4
    )
    assert _check(outcome, "keys").evidence["layout"].startswith("Lightning FSDP sharded")
    assert _check(outcome, "contract").evidence["step_counters"]["train_state.step"] == 4
    assert _drill(real_lightning, sqlite_url, format="lightning").status == "passed"


def test_real_lightning_fsdp_without_meta_pt_fails(real_lightning: Path, sqlite_url: str, tmp_path: Path) -> None:
    run = Path(shutil.copytree(real_lightning, tmp_path / "ckpts"))
    os.remove(run / "epoch=0-step=4.ckpt" / "meta.pt")
    outcome = _drill(run, sqlite_url, "step:4")
    assert ("files", "file-missing", "meta.pt") in _errors(outcome)
    assert verify_checkpoint(str(run / "epoch=0-step=4.ckpt")).result.status.value == "failed"


@pytest.mark.parametrize(("kind", "name"), [("megatron", "common.pt"), ("lightning", "meta.pt")])
def test_a_torchscript_side_file_is_refused_as_code_never_loaded(
    copy_of, kind: str, name: str, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A side file is read with an unpickler that runs nothing — but torch.load would hand a
    TorchScript archive to torch.jit.load, which runs the archive's code."""
    import torch

    from tests.test_security import _torchscript_bytes

    run = copy_of(kind)
    (run / DIRS[kind] / name).write_bytes(_torchscript_bytes())
    calls: list[object] = []
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: calls.append(a))
    outcome = _drill(run, sqlite_url)
    assert calls == []
    assert ("load", "unsafe-pickle", name) in _errors(outcome), _errors(outcome)
    assert outcome.status.value == "failed"
