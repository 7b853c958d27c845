"""Checkpoints written by the libraries' own save code (tests/support/writers.py): clean ones pass (with
at most a warning for what the writer never saves); a flipped byte, a deleted or truncated
shard, a removed optimizer slot or partition, a removed RNG file and a resume pointer ahead of
the data each fail, naming the file or part, in ``drill run`` and ``drill verify`` alike."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from drill import DrillOutcome
from drill.integrity.manifest import seal_files as seal
from drill.verifier import verify_checkpoint
from tests.conftest import capped_drill
from tests.conftest import drill as _drill
from tests.support import writers


def _rewrite(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """Load one of the test's own torch.save files (trusted: its writer ran in this test), edit, save."""

    def rewrite(path: Path) -> None:
        obj = torch.load(path, weights_only=False)
        edit(obj)
        torch.save(obj, path)

    return rewrite


def _drop_snapshot_slot(path: Path) -> None:
    """Remove ``exp_avg`` of the first parameter from a torchsnapshot manifest."""
    doc = json.loads(path.read_text())
    manifest = doc["manifest"]
    del manifest["0/optim/state/0/exp_avg"]
    manifest["0/optim/state/0"]["keys"].remove("exp_avg")
    path.write_text(json.dumps(doc))


def _drop_ds_slot(obj: dict) -> None:
    osd = obj["optimizer_state_dict"]
    base = osd.get("base_optimizer_state") or osd["optimizer_state_dict"]
    del base["state"][0]["exp_avg"]


@dataclass(frozen=True)
class Writer:
    root: str
    """The run root under what the writer wrote."""
    checkpoint: str
    format: str
    shard: str
    """A data file of the checkpoint (deleted, truncated, flipped), as a glob."""
    slot: tuple[str, Callable[[Path], None]] | None
    """(file, edit) removing one optimizer slot; the part then named."""
    rng: str | None = None
    """An RNG or loader file whose loss must fail the drill (relative to the checkpoint)."""
    ahead: tuple[Callable[[Path, Path], None], str, str] | None = None
    """(make the writer's resume pointer run ahead of the data, the finding's code, its subject)."""
    never_saved: frozenset[str] = field(default_factory=frozenset)
    verify_sees_slot: bool = True
    """Whether the rewritten optimizer file is under the checkpoint's seal (torchtune's recipe state is beside it)."""
    pickled: str | None = None
    """A ``torch.save`` file of the writer's that its resume unpickles (relative to the checkpoint)."""


def _drop_first_slot(obj: dict) -> None:
    """``exp_avg`` of the first parameter of a torch.optim state dict (or of one nested under ``optimizer``)."""
    opt = obj["optimizer"] if "optimizer" in obj else obj
    del opt["state"][min(opt["state"])]["exp_avg"]  # the first parameter with state (a LoRA run's base is frozen)


def _latest_ahead(run: Path, ckpt: Path) -> None:
    (run / "latest").write_text("global_step9")


def _link_ahead(link: str, target: str) -> Callable[[Path, Path], None]:
    """The writer's resume link (Composer's ``latest``) pointed at a save never written."""

    def write(run: Path, ckpt: Path) -> None:
        (run / link).unlink()
        os.symlink(target, run / link)

    return write


def _half_written_next(marker: str) -> Callable[[Path, Path], None]:
    """A newer save the library's auto-resume would take, cut before its commit (``marker``)."""

    def write(run: Path, ckpt: Path) -> None:
        number = int(re.sub(r"\D", "", ckpt.name) or 0)
        newer = run / re.sub(r"\d+$", str(number + 1), ckpt.name)
        shutil.copytree(ckpt, newer)
        for path in newer.glob(marker):
            path.unlink()

    return write


WRITERS = {
    "hf-deepspeed": Writer("", "checkpoint-4", "hf-trainer", "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt", ("global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt", _rewrite(_drop_ds_slot)),
                           rng="rng_state.pth", pickled="global_step4/mp_rank_00_model_states.pt", ahead=(_half_written_next("trainer_state.json"), "pointer-incomplete", "Hugging Face's get_last_checkpoint")),
    "deepspeed-zero1": Writer("", "global_step3", "deepspeed", "zero_pp_rank_1_mp_rank_00_optim_states.pt", ("zero_pp_rank_0_mp_rank_00_optim_states.pt", _rewrite(_drop_ds_slot)), ahead=(_latest_ahead, "pointer-ahead", "latest"), never_saved=frozenset({"rng", "dataloader"}), pickled="mp_rank_00_model_states.pt"),
    "deepspeed-zero2": Writer("", "global_step3", "deepspeed", "zero_pp_rank_0_mp_rank_00_optim_states.pt", ("zero_pp_rank_1_mp_rank_00_optim_states.pt", _rewrite(_drop_ds_slot)), ahead=(_latest_ahead, "pointer-ahead", "latest"), never_saved=frozenset({"rng", "dataloader"}), pickled="zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    "deepspeed-zero3": Writer("", "global_step3", "deepspeed", "zero_pp_rank_1_mp_rank_00_model_states.pt", ("zero_pp_rank_0_mp_rank_00_optim_states.pt", _rewrite(_drop_ds_slot)), ahead=(_latest_ahead, "pointer-ahead", "latest"), never_saved=frozenset({"rng", "dataloader"}), pickled="zero_pp_rank_0_mp_rank_00_model_states.pt"),
    "accelerate": Writer("checkpoints", "checkpoint_0", "accelerate", "model.safetensors", ("optimizer.bin", _rewrite(_drop_first_slot)),
                         ahead=(_half_written_next("random_states_*.pkl"), "pointer-incomplete", "accelerate's load_state (automatic_checkpoint_naming)"), pickled="random_states_0.pkl"),
    "accelerate-fsdp": Writer("checkpoints", "checkpoint_0", "accelerate", "optimizer_0/__1_0.distcp", None, rng="random_states_1.pkl", pickled="scheduler.bin"),
    "torchsnapshot": Writer("", "step-3", "torchsnapshot", "batched/*", (".snapshot_metadata", _drop_snapshot_slot), pickled="0/optim/param_groups/0/betas"),
    "torchtune": Writer("output", "epoch_1", "torchtune", "model-*.safetensors", ("../recipe_state/recipe_state.pt", _rewrite(_drop_first_slot)), rng="../recipe_state/recipe_state.pt",
                        ahead=(_half_written_next("*.index.json"), "pointer-incomplete", "torchtune's resume_from_checkpoint"), never_saved=frozenset({"rng", "lr_scheduler"}), verify_sees_slot=False, pickled="../recipe_state/recipe_state.pt"),
    "torchtune-lora": Writer("output", "epoch_1", "torchtune", "adapter_model.pt", ("../recipe_state/recipe_state.pt", _rewrite(_drop_first_slot)), rng="../recipe_state/recipe_state.pt",
                             ahead=(_half_written_next("*.index.json"), "pointer-incomplete", "torchtune's resume_from_checkpoint"), never_saved=frozenset({"rng", "lr_scheduler"}), verify_sees_slot=False, pickled="../recipe_state/recipe_state.pt"),
    "lightning-deepspeed": Writer("", "epoch=1-step=8.ckpt", "lightning-deepspeed", "checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt", ("checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt", _rewrite(_drop_ds_slot)),
                                  ahead=(_link_ahead("last.ckpt", "epoch=2-step=12.ckpt"), "pointer-ahead", "last.ckpt"), never_saved=frozenset({"rng"}), pickled="checkpoint/mp_rank_00_model_states.pt"),
    "composer-sharded": Writer("", "ep1-ba16", "dcp", "__1_0.distcp", None, ahead=(_link_ahead("latest-rank0.pt", "ep2-ba24"), "pointer-ahead", "latest-rank0.pt")),
    "dcp-app": Writer("", "step-3", "dcp", "__0_0.distcp", None),
    "dcp-hf": Writer("", "step-3", "safetensors", "model-00001-of-00001.safetensors", None, never_saved=frozenset({"optimizer", "lr_scheduler", "dataloader", "rng", "train_state"})),
}  # fmt: skip


def _needs(kind: str) -> None:
    why = writers.missing(kind)
    if why is not None:
        pytest.skip(why)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def get(kind: str) -> Path:
        _needs(kind)
        if kind not in cache:
            cache[kind] = writers.spawn(kind, tmp_path_factory.mktemp(kind))
        return cache[kind]

    return get


@pytest.fixture
def copy_of(written, tmp_path: Path):
    def get(kind: str) -> tuple[Path, Path]:
        """(run root, checkpoint) of a private copy."""
        w = WRITERS[kind]
        run = Path(shutil.copytree(written(kind), tmp_path / kind, symlinks=True)) / w.root
        return run, run / w.checkpoint

    return get


def _errors(outcome: DrillOutcome) -> list[tuple[str, str, str | None]]:
    return [(f.check, f.code, f.subject) for f in outcome.findings if f.severity.value == "error"]


def _names(subjects: list[str | None], what: str) -> bool:
    return any(s is not None and what in s for s in subjects)


@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.slow
def test_a_clean_checkpoint_passes_in_run_and_verify(written, kind: str, sqlite_url: str) -> None:
    w = WRITERS[kind]
    run = written(kind) / w.root
    outcome = _drill(run, sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert (
        outcome.checkpoint is not None
        and outcome.checkpoint.name == w.checkpoint
        and outcome.checkpoint.format == w.format
    )
    warned = {str(f.subject) for f in outcome.findings if f.code == "part-not-saved-by-layout"}
    assert warned == set(w.never_saved)
    verified = verify_checkpoint(str(run / w.checkpoint))
    assert verified.status == "passed" and verified.evidence == "structural", verified.result.findings


DAMAGE = ("flip-sealed", "delete", "truncate", "slot", "rng", "pointer")


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.slow
def test_damage_fails_naming_the_file_or_part_in_run_and_verify(
    copy_of, kind: str, damage: str, sqlite_url: str
) -> None:
    w = WRITERS[kind]
    run, ckpt = copy_of(kind)
    shard = sorted(ckpt.glob(w.shard))[0]
    named = str(shard.relative_to(ckpt))
    if damage == "flip-sealed":
        seal(str(ckpt))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    elif damage == "delete":
        shard.unlink()
    elif damage == "truncate":
        os.truncate(shard, shard.stat().st_size // 2)
    elif damage == "slot":
        if w.slot is None:
            pytest.skip(f"{kind}: its optimizer state is DCP's, whose slots the DCP layouts' tests remove")
        seal(str(ckpt))  # a seal names the rewritten file in verify; the run names the part too
        named = w.slot[0] if w.verify_sees_slot else "optimizer.state"  # unsealed, the run names the part
        w.slot[1](ckpt / w.slot[0])
    elif damage == "rng":
        if w.rng is None:
            pytest.skip(f"{kind}: the writer saves no RNG file apart from its commit marker")
        named = w.rng
        (ckpt / w.rng).unlink()
    elif damage == "pointer":
        if w.ahead is None:
            pytest.skip(f"{kind}: the writer keeps no resume pointer")
        make, code, subject = w.ahead
        make(run, ckpt)
        outcome = _drill(run, sqlite_url)
        assert outcome.status == "failed" and ("resume", code, subject) in _errors(outcome), _errors(outcome)
        return
    outcome = _drill(run, sqlite_url)
    errors = _errors(outcome)
    assert outcome.status == "failed" and outcome.exit_code == 1, errors
    assert _names([s for _, _, s in errors], named), errors
    if damage == "slot":
        assert any(code in ("optimizer-slot-missing",) for _, code, _ in errors), errors
    if damage == "slot" and not w.verify_sees_slot:
        return  # the file is beside the sealed directory: verify proves its structure, which a re-save keeps
    verified = verify_checkpoint(str(ckpt))
    assert verified.status == "failed", verified.result.findings
    assert _names([f.subject for f in verified.result.findings if f.severity.value == "error"], named), (
        verified.result.findings
    )


class _Payload:
    """What a hostile writer hides among a trainer's state: the trainer's own ``torch.load``
    would run it on resume."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _bomb(levels: int = 40) -> list:
    """A few KB of pickle that is 10^40 items to any walk: each list holds ten references to the next."""
    inner: list = [0]
    for _ in range(levels):
        inner = [inner] * 10
    return inner


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", [k for k, w in WRITERS.items() if w.pickled])
def test_a_shared_reference_bomb_in_a_writers_own_state_fails_the_drill_at_once(
    copy_of, kind: str, sqlite_url: str
) -> None:
    """A 1.6 KB accelerate ``random_states_0.pkl`` of nested shared references kept ``drill run``
    busy past three minutes: walking it is 10^30 items. Every file a trainer's resume unpickles
    is bounded as it is unpickled (its walk by its size): ``pickle-bomb``, exit 1, in seconds."""
    import time

    w = WRITERS[kind]
    run, ckpt = copy_of(kind)
    path = ckpt / str(w.pickled)
    obj = torch.load(path, weights_only=False)  # the test's own writer's file: trusted
    torch.save({**obj, "client_state": _bomb()} if isinstance(obj, dict) else [obj, _bomb()], path)
    assert path.stat().st_size < 10 << 20
    started = time.monotonic()
    outcome = _drill(run, sqlite_url)
    assert outcome.status == "failed" and outcome.exit_code == 1, _errors(outcome)
    assert any(code == "pickle-bomb" for _, code, _ in _errors(outcome)), _errors(outcome)
    assert time.monotonic() - started < 120  # unbounded, the walk never ends


@pytest.mark.parametrize("kind", [k for k, w in WRITERS.items() if w.pickled])
def test_a_payload_among_a_writers_own_state_fails_run_and_verify_and_never_runs(
    copy_of, kind: str, tmp_path: Path, sqlite_url: str
) -> None:
    """Every file a trainer's resume unpickles (DeepSpeed's model and optimizer states,
    accelerate's RNG states and scheduler, torchsnapshot's objects, torchtune's recipe state,
    the HF Trainer's) is read without running it, and a payload hidden in it among the real state
    is ``pickle-names-code`` in ``run`` and ``verify`` alike, not an inert value that passes."""
    w = WRITERS[kind]
    run, ckpt = copy_of(kind)
    marker = tmp_path / "code-ran"
    path = ckpt / str(w.pickled)
    obj = torch.load(path, weights_only=False)  # the test's own writer's file: trusted
    torch.save({**obj, "client_state": _Payload(marker)} if isinstance(obj, dict) else [obj, _Payload(marker)], path)
    outcome = _drill(run, sqlite_url)
    named = [(c, s) for c, code, s in _errors(outcome) if code == "pickle-names-code"]
    assert outcome.status == "failed" and outcome.exit_code == 1 and named, _errors(outcome)
    assert _names([s for _, s in named], Path(str(w.pickled)).name), named
    refused = [f.message for f in outcome.findings if f.code == "unsafe-pickle"]
    assert all("system, code a trainer's own unpickler would run" in m for m in refused), refused
    if w.verify_sees_slot:  # torchtune's recipe state lies beside the checkpoint verify is given
        verified = verify_checkpoint(str(ckpt))
        assert verified.status == "failed", verified.result.findings
        assert [f.code for f in verified.result.errors] == ["pickle-names-code"], verified.result.findings
        assert "posix.system" in verified.result.errors[0].message or "nt.system" in verified.result.errors[0].message
    assert not marker.exists()


@pytest.mark.slow
def test_a_torchtune_recipe_state_older_than_the_weights_fails_in_run_and_verify(copy_of, sqlite_url: str) -> None:
    """The one recipe_state.pt is overwritten at each save: saved after epoch 0 beside epoch 1's
    weights, a resume would pair new weights with an old optimizer and data position."""
    run, ckpt = copy_of("torchtune")
    _rewrite(lambda obj: obj.update(epochs_run=1))(run / "recipe_state" / "recipe_state.pt")
    outcome = _drill(run, sqlite_url)
    assert outcome.status == "failed" and (
        "integrity",
        "recipe-state-stale",
        "../recipe_state/recipe_state.pt",
    ) in _errors(outcome)
    verified = verify_checkpoint(str(ckpt))
    assert verified.status == "failed" and any(f.code == "recipe-state-stale" for f in verified.result.findings)


@pytest.mark.parametrize("epochs_run", [0, -6, -(10**18)])
def test_a_torchtune_recipe_state_with_no_epoch_run_is_stale_never_a_negative_epoch(
    copy_of, epochs_run: int, sqlite_url: str
) -> None:
    """torchtune saves its recipe state after an epoch, so ``epochs_run`` is at least 1: one of 0
    or below matches no epoch's weights and is ``recipe-state-stale`` saying so, in ``run`` and
    ``verify`` — not "saved after epoch -7"."""
    run, ckpt = copy_of("torchtune")
    _rewrite(lambda obj: obj.update(epochs_run=epochs_run))(run / "recipe_state" / "recipe_state.pt")
    outcome = _drill(run, sqlite_url)
    stale = [f.message for f in outcome.findings if f.code == "recipe-state-stale"]
    verified = verify_checkpoint(str(ckpt))
    stale += [f.message for f in verified.result.errors if f.code == "recipe-state-stale"]
    assert outcome.status == "failed" and verified.status == "failed" and len(stale) == 2, outcome.findings
    assert all(f"epochs_run={epochs_run}, which no saved recipe state says" in m for m in stale), stale
    assert not any("epoch -" in m for m in stale), stale


@pytest.mark.slow
def test_an_older_torchtune_epoch_is_weights_only_and_says_why(written, sqlite_url: str) -> None:
    run = written("torchtune") / "output"
    outcome = _drill(run, sqlite_url, str(run / "epoch_0"))
    assert outcome.status == "passed", _errors(outcome)
    notes = {str(f.subject): f.message for f in outcome.findings if f.code == "part-not-saved-by-layout"}
    assert "optimizer" in notes and "overwritten" in notes["optimizer"]


@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.slow
def test_the_memory_budget_binds_every_writers_checkpoint(written, kind: str, sqlite_url: str) -> None:
    outcome = _drill(written(kind) / WRITERS[kind].root, sqlite_url, memory_budget=16)
    assert (
        outcome.status.value == "error" and "needs" in (outcome.message or "") and "16 B" in (outcome.message or "")
    ), outcome.message


@pytest.mark.parametrize("damaged", [False, True], ids=["clean", "truncated"])
@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.slow
def test_run_verify_and_the_sdk_give_one_structural_verdict(copy_of, kind: str, damaged: bool, sqlite_url: str) -> None:
    """The integrity check of ``drill run``, ``drill verify`` and ``drill.sdk.verified`` (and
    ``drill.sdk.load`` for DCP, which it loads) agree on the same bytes."""
    import drill.sdk

    w = WRITERS[kind]
    run, ckpt = copy_of(kind)
    if damaged:
        shard = sorted(ckpt.glob(w.shard))[0]
        os.truncate(shard, shard.stat().st_size // 2)
    integrity = next(c for c in _drill(run, sqlite_url).checks if c.name == "integrity")
    verified = verify_checkpoint(str(ckpt))
    assert integrity.status.value == verified.result.status.value == ("failed" if damaged else "passed"), (
        integrity.findings,
        verified.result.findings,
    )
    assert {f.subject for f in integrity.errors} == {f.subject for f in verified.result.errors}
    if damaged:
        with pytest.raises(drill.sdk.CheckpointCorrupt):
            drill.sdk.verified(str(ckpt), record=False)
    else:
        assert drill.sdk.verified(str(ckpt), record=False) == str(ckpt)


@pytest.mark.parametrize("evil", ["../../../outside", "/etc/passwd"])
def test_a_snapshot_location_leading_out_is_never_opened_in_run_and_verify(copy_of, evil: str, sqlite_url: str) -> None:
    """torchsnapshot's manifest places each object by a location of its choosing: one that leads
    out of the snapshot is ``path-escapes`` naming the entry, in ``run`` and ``verify``, and the
    entry it should have held is said to be unread for that reason (never "file None")."""
    run, ckpt = copy_of("torchsnapshot")
    meta = ckpt / ".snapshot_metadata"
    text = meta.read_text()
    assert '"location": "0/optim/param_groups/0/betas"' in text
    meta.write_text(text.replace('"location": "0/optim/param_groups/0/betas"', f'"location": "{evil}"', 1))
    outcome = _drill(run, sqlite_url)
    errors = _errors(outcome)
    assert outcome.status == "failed" and ("integrity", "path-escapes", "0/optim/param_groups/0/betas") in errors
    unread = [f.message for f in outcome.findings if f.code == "entry-not-loaded"]
    assert unread and all("None" not in m and "leads out of the snapshot" in m for m in unread), unread
    verified = verify_checkpoint(str(ckpt))
    assert verified.status == "failed"
    assert [(f.code, f.subject) for f in verified.result.errors] == [("path-escapes", "0/optim/param_groups/0/betas")]


def test_a_world_size_past_any_runs_is_implausible_not_enumerated(copy_of, sqlite_url: str) -> None:
    """DeepSpeed's model states claiming ``dp_world_size`` 10^9: ``metadata-implausible`` naming
    the file, within a 2 GiB cap (each of a billion ranks was checked for its partition)."""
    run, ckpt = copy_of("deepspeed-zero1")
    states = ckpt / "mp_rank_00_model_states.pt"
    obj = torch.load(states, weights_only=False)  # the test's own writer's file: trusted
    obj["dp_world_size"] = 10**9
    torch.save(obj, states)
    code, document = capped_drill("run", "--root", str(run), "--no-replay", "--db", sqlite_url)
    errors = [(f["code"], f["subject"]) for c in document["checks"] for f in c["findings"] if f["severity"] == "error"]
    assert code == 1 and ("metadata-implausible", "mp_rank_00_model_states.pt") in errors, errors
    assert len(errors) < 10, errors
    code, document = capped_drill("verify", str(ckpt))  # one structural verdict: verify finds it too
    assert code == 1 and [(f["code"], f["subject"]) for f in document["findings"]] == [
        ("metadata-implausible", "mp_rank_00_model_states.pt")
    ], document["findings"]


@pytest.mark.parametrize("swap", ["garbage", "safetensors"])
@pytest.mark.parametrize("kind", [k for k, w in WRITERS.items() if w.pickled and w.verify_sees_slot])
def test_a_file_its_format_loads_as_torch_save_that_is_not_one_fails_run_and_verify(
    copy_of, kind: str, swap: str, sqlite_url: str
) -> None:
    """A DeepSpeed, accelerate or torchsnapshot file replaced by bytes that are no torch.save
    archive — garbage, or a safetensors file under its name — cannot be loaded by the trainer:
    ``zip-corrupt`` naming it, in ``run`` and in ``verify`` (which said "structurally consistent":
    bytes that are no zip proved nothing, and failed nothing)."""
    from safetensors.torch import save

    w = WRITERS[kind]
    run, ckpt = copy_of(kind)
    path = ckpt / str(w.pickled)
    path.write_bytes(b"\x00garbage" * 64 if swap == "garbage" else save({"w": torch.ones(4)}))
    errors = _errors(_drill(run, sqlite_url))
    assert ("integrity", "zip-corrupt", str(w.pickled)) in errors or (
        "integrity",
        "zip-corrupt",
        path.name,
    ) in errors, errors
    verified = verify_checkpoint(str(ckpt))
    assert verified.status == "failed" and "zip-corrupt" in [f.code for f in verified.result.errors], (
        verified.result.findings
    )


@pytest.mark.parametrize("ahead", [2, 10**18])
def test_a_torchtune_recipe_state_ahead_of_every_saved_epoch_fails_run_and_verify(
    copy_of, ahead: int, sqlite_url: str
) -> None:
    """A recipe state claiming more epochs ran than any epoch's weights saved (the newest is
    epoch_1): torchtune's resume would pair epoch_1's weights with it and skip the epochs between.
    It was taken for a later epoch's state that overwrote epoch_1's ("weights only") and passed."""
    run, ckpt = copy_of("torchtune")
    recipe = run / "recipe_state" / "recipe_state.pt"
    obj = torch.load(recipe, weights_only=False)  # the test's own writer's file: trusted
    obj["epochs_run"] = obj["epochs_run"] + ahead
    torch.save(obj, recipe)
    errors = _errors(_drill(run, sqlite_url))
    assert ("integrity", "recipe-state-ahead", "../recipe_state/recipe_state.pt") in errors, errors
    verified = verify_checkpoint(str(ckpt))
    assert "recipe-state-ahead" in [f.code for f in verified.result.errors], verified.result.findings


@pytest.mark.parametrize(
    ("world_size", "rename", "says"),
    [
        (1, "3", "name no rank below the snapshot's world_size 1"),
        (1, "x", "name no rank below the snapshot's world_size 1"),
        (1, "\u00b2", "name no rank below the snapshot's world_size 1"),
        (0, None, "gives world_size 0, which is no count of ranks"),
        ("2", None, "gives world_size '2', which is no count of ranks"),
        (True, None, "gives world_size True, which is no count of ranks"),
    ],
)
def test_a_snapshot_whose_entries_name_ranks_beyond_its_world_is_implausible(
    copy_of, world_size: object, rename: str | None, says: str, sqlite_url: str
) -> None:
    """torchsnapshot's restore files each entry under its rank (``<rank>/…``) in a list of
    ``world_size``: an entry of rank 3 in a world of 1, a key naming no rank, or a world_size
    that is no count of ranks cannot be restored by it, and drill passed them.
    ``metadata-implausible`` in ``run`` and ``verify`` (a unicode digit is no rank either)."""
    run, ckpt = copy_of("torchsnapshot")
    meta = ckpt / ".snapshot_metadata"
    doc = json.loads(meta.read_text())
    doc["world_size"] = world_size
    if rename is not None:
        doc["manifest"][f"{rename}/progress/step"] = doc["manifest"].pop("0/progress/step")
    meta.write_text(json.dumps(doc))
    found = [f for f in _drill(run, sqlite_url).findings if f.code == "metadata-implausible"]
    verified = verify_checkpoint(str(ckpt))
    found += [f for f in verified.result.errors if f.code == "metadata-implausible"]
    assert verified.status == "failed" and len(found) == 2, (found, verified.result.findings)
    assert all(says in f.message for f in found), [f.message for f in found]


@pytest.mark.parametrize(
    ("kind", "pieces"), [("ChunkedTensor", "chunks"), ("DTensor", "shards"), ("ShardedTensor", "shards")]
)
@pytest.mark.parametrize("shape", [[10**7, 10**7], [6 * 10**9]])
def test_a_tensor_claiming_more_than_its_pieces_is_implausible_never_allocated(
    copy_of, kind: str, pieces: str, shape: list[int], sqlite_url: str
) -> None:
    """A torchsnapshot manifest whose tensor claims a whole shape its pieces cannot fill (10^14
    or 6·10^9 bytes from 5 KB): a chunked tensor's against its chunks, a DTensor's or sharded
    tensor's global shape (its entry holds one rank's shards) against every tensor byte the
    snapshot holds. ``metadata-implausible`` naming the entry, in ``run`` and ``verify``,
    within a 2 GiB cap (the whole was allocated: drill's own error, or the memory)."""
    run, ckpt = copy_of("torchsnapshot")
    meta = ckpt / ".snapshot_metadata"
    doc = json.loads(meta.read_text())
    piece = doc["manifest"]["0/rng/rng_state"]
    doc["manifest"]["0/rng/rng_state"] = {
        "type": kind, "dtype": "torch.uint8", "shape": shape, "replicated": False,
        pieces: [{"offsets": [0] * len(shape), "sizes": piece["shape"], "tensor": piece}],
    }  # fmt: skip
    meta.write_text(json.dumps(doc))
    code, document = capped_drill("run", "--root", str(run), "--no-replay", "--db", sqlite_url)
    errors = [(f["code"], f["subject"]) for c in document["checks"] for f in c["findings"] if f["severity"] == "error"]
    assert code == 1 and ("metadata-implausible", "0/rng/rng_state") in errors, errors
    code, document = capped_drill("verify", str(ckpt))
    assert code == 1 and ("metadata-implausible", "0/rng/rng_state") in [
        (f["code"], f["subject"]) for f in document["findings"]
    ], document["findings"]


def _nan_everywhere(doc: dict) -> int:
    """Every shape, offset and byte range of a torchsnapshot manifest as NaN; how many."""
    n = 0

    def walk(node):  # type: ignore[no-untyped-def]
        nonlocal n
        if isinstance(node, dict):
            for key in ("shape", "offsets", "byte_range"):
                if isinstance(node.get(key), list) and node[key]:
                    node[key] = [float("nan")] + node[key][1:]
                    n += 1
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    return n


def test_a_torchsnapshot_manifest_with_a_nan_for_a_number_fails_the_drill(copy_of, sqlite_url: str) -> None:
    """A ``.snapshot_metadata`` with a NaN shape was an internal ``TypeError`` (exit 5): every
    number the manifest gives a tensor is held to what a tensor's is; damage, exit 1."""
    _needs("torchsnapshot")
    run, ckpt = copy_of("torchsnapshot")
    path = ckpt / ".snapshot_metadata"
    doc = json.loads(path.read_text())
    assert _nan_everywhere(doc) > 0
    path.write_text(json.dumps(doc))  # NaN: YAML reads JSON's NaN too
    outcome = _drill(run, sqlite_url)
    assert (outcome.status, outcome.exit_code) == ("failed", 1), (outcome.status, outcome.message)


@pytest.mark.parametrize(
    ("kind", "removed"), [("accelerate", "dl_state_dict.bin"), ("accelerate", "custom_checkpoint_0.pkl")]
)
def test_a_file_the_runs_other_saves_hold_is_missing_from_this_one(
    copy_of, kind: str, removed: str, sqlite_url: str
) -> None:
    """accelerate's ``load_state`` skips a missing ``dl_state_dict.bin`` and restarts the epoch
    silently; one save alone cannot say its loader was stateful, the run's other saves can."""
    run, ckpt = copy_of(kind)
    newer = Path(shutil.copytree(ckpt, ckpt.with_name(re.sub(r"\d+$", "1", ckpt.name))))
    (newer / removed).unlink()
    outcome = _drill(run, sqlite_url)
    assert outcome.checkpoint is not None and outcome.checkpoint.name == newer.name
    assert outcome.status == "failed" and ("files", "file-missing", removed) in _errors(outcome), _errors(outcome)
    shutil.copy(ckpt / removed, newer / removed)
    (newer / "notes.txt").write_text("not state")  # what the writer does not write every time is not asked for
    assert _drill(run, sqlite_url).status == "passed"


@pytest.mark.parametrize("kind", ["torchtune", "torchtune-lora"])
@pytest.mark.parametrize("part", ["dataloader", "optimizer"])
def test_a_recipe_state_without_a_part_the_recipe_always_saves_fails_naming_it(
    copy_of, kind: str, part: str, sqlite_url: str
) -> None:
    """torchtune resumed a recipe state with its loader removed and said nothing: the part is
    required, and an absent one is never read as an empty one."""
    run, ckpt = copy_of(kind)
    _rewrite(lambda obj: obj.pop(part))(ckpt / "../recipe_state/recipe_state.pt")
    outcome = _drill(run, sqlite_url)
    assert outcome.status == "failed" and ("keys", "part-missing", part) in _errors(outcome), _errors(outcome)


# -- Composer's monolithic checkpoints: one torch.save file per save, and the link autoresume follows
COMPOSER_NEWEST = "ep1-ba16-rank0.pt"


def _flip_in_a_tensor(path: Path) -> None:
    """One bit of the first tensor's bytes (inside a record its CRC-32 covers)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename)
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0x01
    path.write_bytes(bytes(data))


COMPOSER_DAMAGE = {
    "flip": (_flip_in_a_tensor, ("integrity", "crc-mismatch", COMPOSER_NEWEST), True),
    "truncate": (lambda p: os.truncate(p, p.stat().st_size // 2), ("integrity", "zip-corrupt", COMPOSER_NEWEST), True),
    "slot": (_rewrite(lambda o: o["state"]["optimizers"]["AdamW"]["state"].pop("module.0.weight")),
             ("contract", "optimizer-slot-missing", "optimizer.state.module.0.weight.exp_avg"), False),
    "rng": (_rewrite(lambda o: o.pop("rng")), ("keys", "part-missing", "rng"), False),
    "rng-rank": (_rewrite(lambda o: o["rng"][0].pop("numpy")), ("contract", "rng-generator-missing", "rng.rank_0"), False),
    "loader": (_rewrite(lambda o: o["state"].pop("dataset_state")), ("keys", "part-incomplete", "dataloader.dataset_state"), False),
    "timestamp": (_rewrite(lambda o: o["state"].pop("timestamp")), ("keys", "part-missing", "train_state"), False),
}  # fmt: skip


@pytest.fixture
def composer_run(written, tmp_path: Path) -> Path:
    return Path(shutil.copytree(written("composer"), tmp_path / "composer", symlinks=True))


def test_a_clean_composer_checkpoint_passes_and_its_link_is_a_pointer(composer_run: Path, sqlite_url: str) -> None:
    outcome = _drill(composer_run, sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert outcome.checkpoint is not None and (outcome.checkpoint.name, outcome.checkpoint.format) == (
        COMPOSER_NEWEST,
        "composer",
    )
    assert outcome.checkpoint.step == 16 and "latest-rank0.pt" not in [c.name for c in _listed(composer_run)]
    assert verify_checkpoint(str(composer_run / COMPOSER_NEWEST)).status == "passed"
    renamed = composer_run / "final.pt"  # known by its shape whatever its name
    shutil.copy(composer_run / COMPOSER_NEWEST, renamed)
    outcome = _drill(renamed, sqlite_url)
    assert outcome.status == "passed" and outcome.check("keys").evidence["format"] == "composer", _errors(outcome)


def _listed(run: Path) -> list:
    from drill.discover import discover
    from drill.storage import LocalStorage

    return discover(LocalStorage(), str(run)).checkpoints


@pytest.mark.parametrize("damage", COMPOSER_DAMAGE)
def test_damage_to_a_composer_checkpoint_fails_naming_it(composer_run: Path, damage: str, sqlite_url: str) -> None:
    edit, finding, in_verify = COMPOSER_DAMAGE[damage]
    edit(composer_run / COMPOSER_NEWEST)
    outcome = _drill(composer_run, sqlite_url)
    assert outcome.status == "failed" and outcome.exit_code == 1, _errors(outcome)
    assert finding in _errors(outcome), _errors(outcome)
    if in_verify:
        verified = verify_checkpoint(str(composer_run / COMPOSER_NEWEST))
        assert verified.status == "failed" and any(f.code == finding[1] for f in verified.result.findings)


@pytest.mark.parametrize(
    ("how", "code"), [("ahead", "pointer-ahead"), ("dangling", "pointer-dangling"), ("deleted", "pointer-ahead")]
)
def test_composers_latest_link_dangling_or_ahead_fails(
    composer_run: Path, how: str, code: str, sqlite_url: str
) -> None:
    """Composer's autoresume restarts from batch 0 when its link dangles: drill names the link."""
    link = composer_run / "latest-rank0.pt"
    if how == "deleted":
        (composer_run / COMPOSER_NEWEST).unlink()  # the link now names a save that is gone
    else:
        link.unlink()
        os.symlink("ep2-ba24-rank0.pt" if how == "ahead" else "checkpoint-final.pt", link)
    outcome = _drill(composer_run, sqlite_url)
    assert outcome.status == "failed" and ("resume", code, "latest-rank0.pt") in _errors(outcome), _errors(outcome)


@pytest.mark.parametrize(("removed", "part"), [("loops", "dataloader"), ("lr_schedulers", None)])
def test_lightnings_state_inside_deepspeeds_checkpoint_is_checked(
    copy_of, removed: str, part: str | None, sqlite_url: str
) -> None:
    """Lightning with DeepSpeed restarts at step 0 when its loops are missing: they travel in
    DeepSpeed's client state, and drill reads them there (a scheduler is recommended: a warning)."""
    run, ckpt = copy_of("lightning-deepspeed")
    _rewrite(lambda obj: obj.pop(removed))(ckpt / "checkpoint" / "mp_rank_00_model_states.pt")
    outcome = _drill(run, sqlite_url)
    if part is None:
        assert outcome.status == "passed" and "lr_scheduler" in [
            f.subject for f in outcome.findings if f.code == "part-missing"
        ]
        return
    assert outcome.status == "failed" and ("keys", "part-missing", part) in _errors(outcome), _errors(outcome)


def test_a_torchsnapshot_without_its_rng_state_fails_naming_it(copy_of, sqlite_url: str) -> None:
    """The RNG entry cut from the manifest was read as "this run never saved it" (exit 0)."""
    run, ckpt = copy_of("torchsnapshot")
    path = ckpt / ".snapshot_metadata"
    doc = json.loads(path.read_text())
    cut = [k for k in doc["manifest"] if k.split("/")[1:2] == ["rng"]]
    assert cut, sorted(doc["manifest"])
    for key in cut:
        del doc["manifest"][key]
    path.write_text(json.dumps(doc))
    outcome = _drill(run, sqlite_url)
    assert outcome.status == "failed" and ("keys", "part-missing", "rng") in _errors(outcome), _errors(outcome)


def test_lightnings_deepspeed_checkpoint_drilled_one_level_down_is_still_lightnings(copy_of, sqlite_url: str) -> None:
    """``--root epoch=1-step=8.ckpt/checkpoint``: a DeepSpeed checkpoint whose client state is
    Lightning's — its loops read and required there too."""
    run, ckpt = copy_of("lightning-deepspeed")
    inner = ckpt / "checkpoint"
    outcome = _drill(inner, sqlite_url)
    assert outcome.status == "passed" and outcome.check("keys").evidence["parts"].get("dataloader"), _errors(outcome)
    _rewrite(lambda obj: obj.pop("loops"))(inner / "mp_rank_00_model_states.pt")
    outcome = _drill(inner, sqlite_url)
    assert outcome.status == "failed" and ("keys", "part-missing", "dataloader") in _errors(outcome), _errors(outcome)
