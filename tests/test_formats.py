"""Format adapters and the resume contract, on checkpoints written by real code."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from drill import DrillOutcome
from drill.checks import Expectations
from drill.discover import discover
from drill.formats import restore
from drill.integrity.manifest import seal_files as seal
from drill.storage import LocalStorage
from tests.conftest import capped_drill
from tests.conftest import drill as _drill
from tests.support import frameworks


def _errors(outcome: DrillOutcome) -> list[tuple[str, str, str | None]]:
    return [(f.check, f.code, f.subject) for f in outcome.findings if f.severity.value == "error"]


def _check(outcome: DrillOutcome, name: str):
    return next(c for c in outcome.checks if c.name == name)


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="transformers is not installed: no real HF Trainer checkpoint")
    return frameworks.hf_trainer_run(tmp_path_factory.mktemp("hf") / "out")


@pytest.fixture(scope="session")
def lightning_ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lightning", reason="lightning is not installed: no real Lightning checkpoint")
    return frameworks.lightning_run(tmp_path_factory.mktemp("pl"))


@pytest.fixture
def hf_copy(hf_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(hf_run, tmp_path / "hf"))


def rewrite_dcp(ckpt: Path, mutate: Callable[[dict[str, Any]], None]) -> None:
    """Re-save a real DCP checkpoint with one defect, and re-seal it (so hashes pass)."""
    ref = discover(LocalStorage(), str(ckpt)).checkpoints[0]
    state = restore(LocalStorage(), ref, torch.device("cpu")).state
    mutate(state)
    shutil.rmtree(ckpt)
    with pytest.warns(UserWarning):
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(ckpt), thread_count=2))
    seal(ckpt)


# -- clean checkpoints of every format pass, and show what they hold -----------------------
def test_clean_dcp(demo_run: Path, sqlite_url: str) -> None:
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    keys = _check(outcome, "keys")
    assert keys.evidence["format"] == "dcp"
    assert set(keys.evidence["tensors"]) == {"model", "optimizer", "rng"}
    contract = _check(outcome, "contract")
    assert contract.evidence["step_counters"] == {
        "train_state.step": 30,
        "optimizer step": 30,
        "lr_scheduler.last_epoch": 30,
        "lr_scheduler._step_count - 1": 30,
        "directory name": 30,
    }
    assert not contract.findings


def test_clean_nanogpt_torch_save(tmp_path: Path, sqlite_url: str) -> None:
    frameworks.nanogpt_checkpoint(tmp_path / "out")
    outcome = _drill(tmp_path / "out", sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert _check(outcome, "keys").evidence["format"] == "torch-save"
    assert _check(outcome, "contract").evidence["step_counters"]["train_state.step"] == frameworks.TINY.steps
    warned = {(f.code, f.subject) for f in outcome.findings if f.severity.value == "warning"}
    assert ("part-missing", "rng") in warned and ("part-missing", "dataloader") in warned


@pytest.mark.slow
def test_clean_lightning(lightning_ckpts: Path, sqlite_url: str) -> None:
    outcome = _drill(lightning_ckpts, sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert outcome.checkpoint is not None and outcome.checkpoint.step == 4
    keys = _check(outcome, "keys")
    assert keys.evidence["format"] == "lightning"
    assert {"model", "optimizer", "lr_scheduler", "train_state", "dataloader"} <= set(keys.evidence["parts"])


@pytest.mark.slow
def test_clean_hf_trainer(hf_run: Path, sqlite_url: str) -> None:
    outcome = _drill(hf_run, sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert outcome.checkpoint is not None and outcome.checkpoint.name == "checkpoint-4"
    assert _check(outcome, "keys").evidence["format"] == "hf-trainer"
    counters = _check(outcome, "contract").evidence["step_counters"]
    assert set(counters.values()) == {4} and "trainer_state.json global_step" in counters
    assert "checkpoint-4 (works)" in _check(outcome, "resume").summary


def test_format_can_be_forced(demo_run: Path, sqlite_url: str) -> None:
    outcome = _drill(demo_run, sqlite_url, format="hf-trainer")
    assert outcome.status == "failed"  # a DCP directory read as HF holds none of HF's files


# -- each injected defect fails the drill with its own finding -----------------------------
def test_one_parameters_exp_avg_removed(demo_run: Path, sqlite_url: str) -> None:
    rewrite_dcp(demo_run / "step-30", lambda s: s.pop("optimizer.state.blocks.0.attn.qkv.weight.exp_avg"))
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed"
    assert _errors(outcome) == [
        ("contract", "optimizer-slot-missing", "optimizer.state.blocks.0.attn.qkv.weight.exp_avg")
    ]
    assert _check(outcome, "integrity").status.value == "passed"  # the bytes are as sealed


def test_scheduler_step_off_by_one(demo_run: Path, sqlite_url: str) -> None:
    def off_by_one(s: dict[str, Any]) -> None:
        s["lr_scheduler.last_epoch"] -= 1
        s["lr_scheduler._step_count"] -= 1

    rewrite_dcp(demo_run / "step-30", off_by_one)
    outcome = _drill(demo_run, sqlite_url)
    (finding,) = [f for f in outcome.findings if f.code == "step-mismatch"]
    assert "lr_scheduler.last_epoch=29" in finding.message and "off by -1" in finding.message
    assert outcome.status == "failed"


def test_dataloader_state_from_an_earlier_step(demo_run: Path, sqlite_url: str) -> None:
    earlier = restore(
        LocalStorage(), discover(LocalStorage(), str(demo_run / "step-10")).checkpoints[0], torch.device("cpu")
    ).state

    def copy_loader(s: dict[str, Any]) -> None:
        for k in [k for k in s if k.startswith("dataloader.")]:
            s[k] = earlier[k]

    rewrite_dcp(demo_run / "step-30", copy_loader)
    outcome = _drill(demo_run, sqlite_url)
    assert ("contract", "dataloader-step-mismatch", "dataloader") in _errors(outcome)
    (finding,) = [f for f in outcome.findings if f.code == "dataloader-step-mismatch"]
    assert (
        "consumed 10 batches but train_state is at step 30" in finding.message
        and "repeat 20 batches" in finding.message
    )


def test_nan_in_one_moment_tensor(demo_run: Path, sqlite_url: str) -> None:
    key = "optimizer.state.head.weight.exp_avg_sq"

    def poison(s: dict[str, Any]) -> None:
        s[key] = s[key].clone()
        s[key][3, 5] = float("nan")

    rewrite_dcp(demo_run / "step-30", poison)
    outcome = _drill(demo_run, sqlite_url)
    assert _errors(outcome) == [("contract", "non-finite", key)]
    assert _drill(demo_run, sqlite_url, expectations=Expectations(finite_scan="off")).status == "passed"


def test_latest_pointer_to_a_half_written_directory(demo_run: Path, sqlite_url: str) -> None:
    half = demo_run / "step-40"
    half.mkdir()
    shutil.copy(demo_run / "step-30" / "__0_0.distcp", half / "__0_0.distcp")
    (demo_run / "latest").symlink_to("step-40")
    outcome = _drill(demo_run, sqlite_url)
    assert ("resume", "pointer-incomplete", "latest") in _errors(outcome)
    assert outcome.checkpoint is not None and outcome.checkpoint.name == "step-30"  # never drilled the half save
    (demo_run / "latest").unlink()
    (demo_run / "latest").write_text("step-90\n")
    assert ("resume", "pointer-ahead", "latest") in _errors(_drill(demo_run, sqlite_url))


@pytest.mark.parametrize("target", ["\u00b2", "\u2460\u2461", "step-\u0669\u0669"])
def test_a_pointer_naming_a_step_in_digits_no_integer_reads_is_a_finding_not_a_crash(
    demo_run: Path, sqlite_url: str, target: str
) -> None:
    """``latest`` holding "²" (a digit to ``str.isdigit``, none to ``int``) ended the drill in
    an internal ``ValueError`` (exit 5); "step-٩٩" (Arabic-Indic digits) was step 99, a pointer ahead. Steps and
    ranks are read in ASCII digits (:func:`drill.units.decimal`): the pointer names no
    checkpoint here, and says so."""
    (demo_run / "latest").write_text(target + "\n")
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed" and ("resume", "pointer-dangling", "latest") in _errors(outcome), _errors(outcome)


@pytest.mark.slow
def test_hf_two_ranks_with_rng_state_1_deleted(hf_copy: Path, sqlite_url: str) -> None:
    ckpt = hf_copy / "checkpoint-4"
    os.rename(ckpt / "rng_state.pth", ckpt / "rng_state_0.pth")
    shutil.copy(ckpt / "rng_state_0.pth", ckpt / "rng_state_1.pth")
    assert _drill(hf_copy, sqlite_url).status == "passed"  # a clean two-rank layout
    os.remove(ckpt / "rng_state_1.pth")
    outcome = _drill(hf_copy, sqlite_url)
    assert _errors(outcome) == [("contract", "rng-rank-missing", "rng_state_1.pth")]
    assert next(f for f in outcome.findings if f.code == "rng-rank-missing").rank == 1


def _counted(document: dict[str, Any], code: str) -> tuple[int, str]:
    """(findings of ``code`` in an outcome document, the last one's message)."""
    found = [f for c in document["checks"] for f in c["findings"] if f["code"] == code]
    return len(found), found[-1]["message"] if found else ""


def test_a_rank_number_in_a_file_name_costs_what_one_file_costs(hf_copy: Path, sqlite_url: str) -> None:
    """``rng_state_999999999.pth`` beside rank 0's: the 999,999,998 ranks missing between them
    are counted, not enumerated (a billion findings took 12 GB and minutes)."""
    ckpt = hf_copy / "checkpoint-4"
    os.rename(ckpt / "rng_state.pth", ckpt / "rng_state_0.pth")
    shutil.copy(ckpt / "rng_state_0.pth", ckpt / "rng_state_999999999.pth")
    code, document = capped_drill("run", "--root", str(hf_copy), "--no-replay", "--db", sqlite_url)
    assert code == 1 and document["status"] == "failed"
    count, last = _counted(document, "rng-rank-missing")
    assert count == 100 and "(999999998 in all)" in last, (count, last)


def test_a_rank_number_in_a_key_costs_what_one_key_costs(demo_run: Path, sqlite_url: str) -> None:
    def far_rank(s: dict[str, Any]) -> None:
        s["dataloader.dp_rank_0.position"] = torch.tensor(0)
        s["dataloader.dp_rank_999999999.position"] = torch.tensor(0)

    rewrite_dcp(demo_run / "step-30", far_rank)
    code, document = capped_drill("run", "--root", str(demo_run), "--no-replay", "--db", sqlite_url)
    assert code == 1
    count, last = _counted(document, "dataloader-rank-missing")
    assert count == 100 and "(999999998 in all)" in last, (count, last)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hf_malicious_pickle_in_optimizer_pt(hf_copy: Path, sqlite_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"state": {}, "param_groups": [], "evil": _Payload(marker)}, hf_copy / "checkpoint-4" / "optimizer.pt")
    outcome = _drill(hf_copy, sqlite_url)
    assert outcome.status == "failed"
    assert ("load", "unsafe-pickle", "optimizer.pt") in _errors(outcome)
    assert not marker.exists()


def test_hf_highest_checkpoint_incomplete(hf_copy: Path, sqlite_url: str) -> None:
    os.remove(hf_copy / "checkpoint-4" / "trainer_state.json")
    outcome = _drill(hf_copy, sqlite_url)
    assert outcome.checkpoint is not None and outcome.checkpoint.name == "checkpoint-2"
    assert ("resume", "pointer-incomplete", "Hugging Face's get_last_checkpoint") in _errors(
        outcome
    )  # it would pick the unfinished one


@pytest.mark.slow
def test_training_args_are_read_for_their_seed_without_an_allow_list_or_an_import(
    hf_run: Path, sqlite_url: str
) -> None:
    """The current Trainer pickles accelerate's PartialState, its AcceleratorConfig and a
    torch.device into training_args.bin: read inert, every class is a stand-in — no allow-list
    to keep up with transformers, nothing of transformers imported (or billed as restore time)."""
    import subprocess
    import sys

    outcome = _drill(hf_run, sqlite_url)
    assert outcome.status == "passed"
    contract = _check(outcome, "contract")
    assert not any("training_args.bin" in n for n in contract.evidence.get("notes", []))
    code = (
        "import sys; from drill.formats.hf import _load_training_args; "
        f"args = _load_training_args(memoryview(open({str(hf_run / 'checkpoint-4' / 'training_args.bin')!r}, 'rb').read())); "
        "print(args['seed'], 'transformers' in sys.modules, 'accelerate' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [
        "7",
        "False",
        "False",
    ]


def test_lightning_layout_without_lightning(tmp_path: Path, sqlite_url: str) -> None:
    """Core coverage of the Lightning adapter on a .ckpt written by the same torch.save path."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    ckpt = {
        "epoch": 0,
        "global_step": 1,
        "pytorch-lightning_version": "2.6.0",
        "state_dict": model.state_dict(),
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 0}}}},
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [],
        "callbacks": {},
    }
    torch.save(ckpt, tmp_path / "epoch=0-step=1.ckpt")
    outcome = _drill(tmp_path, sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    assert _check(outcome, "keys").evidence["format"] == "lightning"
    del ckpt["optimizer_states"][0]["state"][0]["exp_avg"]
    torch.save(ckpt, tmp_path / "epoch=0-step=1.ckpt")
    assert _errors(_drill(tmp_path, sqlite_url)) == [
        ("contract", "optimizer-slot-missing", "optimizer.state.0.exp_avg")
    ]


def test_inventory_comes_from_the_dcp_index(demo_run: Path, sqlite_url: str) -> None:
    keys = _check(_drill(demo_run, sqlite_url), "keys")
    inv = {e["key"]: e for e in keys.evidence["inventory"]}
    assert inv["model.head.weight"] == {
        "key": "model.head.weight",
        "shape": [64, 64],
        "dtype": "float32",
        "bytes": 64 * 64 * 4,
    }
    assert keys.evidence["inventory_entries"] == sum(p["tensors"] for p in keys.evidence["tensors"].values())


def test_hf_inventory_names_rng_ranks(hf_copy: Path, sqlite_url: str) -> None:
    ckpt = hf_copy / "checkpoint-4"
    os.rename(ckpt / "rng_state.pth", ckpt / "rng_state_0.pth")
    shutil.copy(ckpt / "rng_state_0.pth", ckpt / "rng_state_1.pth")
    inv = _check(_drill(hf_copy, sqlite_url), "keys").evidence["inventory"]
    assert {e.get("rank") for e in inv if e["key"].startswith("rng.")} == {0, 1}


@pytest.mark.parametrize("damaged", [False, True], ids=["clean", "truncated"])
@pytest.mark.parametrize("kind", ["dcp", "hf-trainer", "torch-save", "lightning"])
@pytest.mark.slow
def test_run_verify_and_the_sdk_give_one_structural_verdict(
    kind: str, damaged: bool, demo_run: Path, hf_run: Path, lightning_ckpts: Path, tmp_path: Path, sqlite_url: str
) -> None:
    """The integrity check of ``drill run``, ``drill verify`` and ``drill.sdk.verified`` agree on
    the same bytes, for every format (the new writers' formats: tests/test_writers.py)."""
    import shutil

    import drill.sdk
    from drill.verifier import verify_checkpoint

    if kind == "dcp":
        run = demo_run
        ckpt = max((p for p in run.iterdir() if p.name.startswith("step-")), key=lambda p: int(p.name.split("-")[1]))
        (ckpt / "drill-manifest.json").unlink()  # the structural verdict: unsealed
        shard = ckpt / "__0_0.distcp"
    elif kind == "hf-trainer":
        run = Path(shutil.copytree(hf_run, tmp_path / "hf"))
        ckpt = run / "checkpoint-4"
        shard = ckpt / "model.safetensors"
    elif kind == "torch-save":
        run = tmp_path / "out"
        ckpt = shard = frameworks.nanogpt_checkpoint(run)
    else:
        run = Path(shutil.copytree(lightning_ckpts, tmp_path / "pl"))
        ckpt = shard = next(run.glob("*.ckpt"))
    if damaged:
        os.truncate(shard, shard.stat().st_size * 3 // 4)
    integrity = next(c for c in _drill(run, sqlite_url, str(ckpt)).checks if c.name == "integrity")
    verified = verify_checkpoint(str(ckpt))
    assert integrity.status.value == verified.result.status.value == ("failed" if damaged else "passed"), (
        integrity.findings,
        verified.result.findings,
    )
    assert verified.evidence == "structural"
    if damaged:
        with pytest.raises(drill.sdk.CheckpointCorrupt):
            drill.sdk.verified(str(ckpt), record=False)
    else:
        assert drill.sdk.verified(str(ckpt), record=False) == str(ckpt)


class _Counted(list):
    """Entries that count how often they are walked."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_every_format_recognizes_a_directory_of_thousands_from_one_index(tmp_path: Path) -> None:
    """Nine formats are asked of every directory: each looks names up in the listing's index
    (:class:`drill.storage.Listing`), so 20,000 shards are walked twice (the index by name,
    the index by suffix), not once per format — and the answers are the same as a walk's."""
    from drill import formats
    from drill.storage import Entry, EntryKind, Listing

    def entry(name: str, kind: EntryKind = EntryKind.FILE) -> Entry:
        return Entry(name, f"{tmp_path}/{name}", kind, 16, 1.0)

    shards = [entry(f"__0_{i}.distcp") for i in range(20_000)]
    cases = {
        "dcp": [entry(".metadata"), *shards],
        "hf-trainer": [entry("trainer_state.json"), entry("optimizer.pt"), *shards],
        "accelerate": [entry("random_states_0.pkl"), entry("model.safetensors"), *shards],
        "deepspeed": [entry("mp_rank_00_model_states.pt"), *shards],
        "torchsnapshot": [entry(".snapshot_metadata"), entry("0", EntryKind.DIR), *shards],
        "safetensors": [entry("model.safetensors.index.json"), entry("model-00001-of-00001.safetensors"), *shards],
    }
    storage = LocalStorage()
    for expected, entries in cases.items():
        listed = Listing.of(_Counted(sorted(entries, key=lambda e: e.name)))
        _Counted.walks = 0
        found = formats.recognize(storage, str(tmp_path / "step-7"), "step-7", listed)
        assert found is not None and getattr(found, "format", None) == expected, (expected, found)
        assert _Counted.walks <= 2, f"{expected}: the listing was walked {_Counted.walks} times"
    incomplete = formats.recognize(storage, str(tmp_path / "step-7"), "step-7", Listing(shards))
    assert incomplete is not None and "no .metadata" in getattr(incomplete, "reason", "")


def test_a_listing_answers_by_name_suffix_and_kind() -> None:
    from drill.storage import Entry, EntryKind, Listing

    entries = [
        Entry(n, n, k, 1, 0.0)
        for n, k in [
            ("a.pt", EntryKind.FILE),
            ("b", EntryKind.DIR),
            (".hidden", EntryKind.FILE),
            ("c.pt", EntryKind.DIR),
        ]
    ]
    listing = Listing(entries)
    assert Listing.of(listing) is listing and list(listing) == entries
    assert listing.get("b") == entries[1] and listing.get("zz") is None
    assert listing.file("b") is None and listing.file("a.pt") == entries[0]
    assert [e.name for e in listing.suffixed(".pt")] == ["a.pt", "c.pt"]
    assert [e.name for e in listing.suffixed("")] == ["b", ".hidden"]  # a leading dot is a name, not a suffix
    assert [e.name for e in listing.suffixed(".pt", "")] == [".hidden", "a.pt", "b", "c.pt"]
    assert [e.name for e in listing.dirs] == ["b", "c.pt"]


@pytest.mark.parametrize("damage", ["truncated", "not-json", "empty"])
def test_a_damaged_trainer_state_fails_verify_as_it_fails_the_run(hf_copy: Path, damage: str, sqlite_url: str) -> None:
    """``trainer_state.json`` is what a Trainer resume reads its step from: a run that cannot
    parse it fails, and ``drill verify`` of the same bytes says so too (it passed as
    "structurally consistent"), as does ``drill.sdk.verified``."""
    import drill.sdk
    from drill.verifier import verify_checkpoint

    ckpt = hf_copy / "checkpoint-4"
    state = ckpt / "trainer_state.json"
    text = state.read_bytes()
    state.write_bytes({"truncated": text[: len(text) // 2], "not-json": b"\x00" * 64, "empty": b""}[damage])
    integrity = next(c for c in _drill(hf_copy, sqlite_url, str(ckpt)).checks if c.name == "integrity")
    verified = verify_checkpoint(str(ckpt))
    assert [(f.code, f.subject) for f in integrity.errors] == [("json-corrupt", "trainer_state.json")]
    assert [(f.code, f.subject) for f in verified.result.errors] == [("json-corrupt", "trainer_state.json")]
    with pytest.raises(drill.sdk.CheckpointCorrupt):
        drill.sdk.verified(str(ckpt), record=False)


@pytest.mark.parametrize("kind", ["torch.save", "a directory past the first look", "a comment past it", "short"])
def test_an_entrys_records_are_those_of_its_whole_tail_from_a_first_small_look(kind: str) -> None:
    """tail_records reads an entry's last 4 KiB first and its last 64 KiB only where those do
    not hold its directory: the records are those the whole 64 KiB tail gives, every time."""
    import zipfile

    from drill.formats import dcp_entries as e

    buf = io.BytesIO()
    if kind == "torch.save":
        torch.save(torch.randn(70_000), buf)
    elif kind == "short":
        torch.save(torch.tensor(1.0), buf)
    else:
        with zipfile.ZipFile(buf, "w") as z:
            names = 120 if kind == "a directory past the first look" else 2
            for i in range(names):
                z.writestr(f"archive/data/{i}-{'x' * 40}", os.urandom(100))
            if kind == "a comment past it":
                z.comment = b"c" * 6000
    data = memoryview(buf.getvalue())
    looks: list[int] = []

    def peek(at: int, n: int) -> memoryview:
        looks.append(n)
        return data[at : at + n]

    whole = e.records(data[-min(len(data), e.TAIL_BYTES) :], len(data))
    assert whole is not None
    assert e.tail_records(peek, len(data)) == whole
    first = min(len(data), e.TAIL_FIRST)
    assert looks == ([first] if kind in ("torch.save", "short") else [first, min(len(data), e.TAIL_BYTES)])
