"""Discovery and selection: pure functions over a directory listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave
from drill.discover import discover
from drill.errors import NothingToDrill
from drill.select import Selector, parse_selector, select
from drill.storage import LocalStorage


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest", Selector("latest")),
        ("oldest", Selector("oldest")),
        ("step:1200", Selector("step", step=1200)),
        ("./run/step-40", Selector("path", path="./run/step-40")),
        ("/abs/step-40", Selector("path", path="/abs/step-40")),
        ("step-40", Selector("path", path="step-40")),
        ("epoch_1", Selector("path", path="epoch_1")),  # torchtune's, by its name under the root
        ("ckpt-0042", Selector("path", path="ckpt-0042")),
    ],
)
def test_parse_selector(text: str, expected: Selector) -> None:
    assert parse_selector(text) == expected


@pytest.mark.parametrize("text", ["newest", "step:", "step:-1", "step:abc", "latest:2", "", "lastest", "step:2:3"])
def test_parse_selector_rejects_unknown_forms(text: str) -> None:
    with pytest.raises(ValueError):
        parse_selector(text)


def _ref(step: int) -> CheckpointRef:
    return CheckpointRef(uri=f"/r/step-{step}", name=f"step-{step}", step=step, format="dcp", mtime=0.0)


DISCOVERY = Discovery(
    root="/r",
    checkpoints=[_ref(10), _ref(20), _ref(30)],
    incomplete=[IncompleteSave("/r/step-40", "step-40", 40, "no .metadata: the save never finished")],
)


def test_select_latest_never_picks_an_incomplete_save() -> None:
    assert select(DISCOVERY, Selector("latest")).ref.step == 30


def test_select_oldest_and_step() -> None:
    assert select(DISCOVERY, Selector("oldest")).ref.step == 10
    assert select(DISCOVERY, Selector("step", step=20)).ref.step == 20


def test_select_step_of_an_incomplete_save_says_so() -> None:
    with pytest.raises(NothingToDrill, match="incomplete save"):
        select(DISCOVERY, Selector("step", step=40))


def test_select_missing_step_lists_the_retained_ones() -> None:
    with pytest.raises(NothingToDrill, match=r"retained: 10, 20, 30") as info:
        select(DISCOVERY, Selector("step", step=5))
    assert info.value.hint == "drill a retained one: drill run --root /r --checkpoint step:30"


def test_missing_step_among_checkpoints_without_steps_gives_a_usable_hint() -> None:
    plain = Discovery(
        root="/r",
        checkpoints=[CheckpointRef(uri="/r/final.pt", name="final.pt", step=None, format="torch-save", mtime=0.0)],
    )
    with pytest.raises(NothingToDrill, match="retained: final.pt") as info:
        select(plain, Selector("step", step=12))
    assert "step:None" not in str(info.value.hint) and "/r/final.pt" in str(info.value.hint)


def test_select_with_only_incomplete_saves() -> None:
    only = Discovery(root="/r", incomplete=DISCOVERY.incomplete)
    with pytest.raises(NothingToDrill, match="only incomplete saves"):
        select(only, Selector("latest"))


def test_discover_classifies_directories(tmp_path: Path) -> None:
    for name in ("step-5", "step-10", "step-15", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-5" / ".metadata").write_bytes(b"x")
    (tmp_path / "step-10" / ".metadata").write_bytes(b"x")
    (tmp_path / "step-15" / "__0_0.distcp").write_bytes(b"half")
    (tmp_path / "step-25").mkdir()
    (tmp_path / "step-25" / "model.safetensors").write_bytes(b"half")
    (tmp_path / "step-20").write_text("a file, not a save")
    found = discover(LocalStorage(), str(tmp_path))
    assert [c.step for c in found.checkpoints] == [5, 10]
    assert [s.step for s in found.incomplete] == [15, 25]
    assert found.incomplete[0].reason == "DCP shards but no .metadata: the save never finished"
    assert "the save never finished" in found.incomplete[1].reason and ".metadata" in found.incomplete[1].reason


def test_discover_a_checkpoint_directory_itself(pristine_run: Path) -> None:
    found = discover(LocalStorage(), str(pristine_run / "step-20"))
    assert [c.name for c in found.checkpoints] == ["step-20"]


def test_discover_missing_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        discover(LocalStorage(), str(tmp_path / "absent"))
