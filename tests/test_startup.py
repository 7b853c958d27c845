"""What a drill imports and pays before its first byte: DCP's index is read without importing
DCP, whose import (DTensor, sympy) costs as much as restoring a small checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from drill.formats.dcp_types import is_bytes, is_tensor, load_metadata
from drill.safe_pickle import restricted_loads
from tests.conftest import fresh_python


@pytest.mark.slow
def test_a_drill_restores_and_verifies_without_importing_dcp(demo_run: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from drill import DrillRequest, run_drill\n"
        "from drill.replay import ReplaySpec\n"
        "from drill.verifier import verify_checkpoint\n"
        f"o = run_drill(DrillRequest(selector='latest', root={str(demo_run)!r}, replay=ReplaySpec(enabled=False)), db={f'sqlite:///{tmp_path}/d.db'!r})\n"
        "assert o.status.value == 'passed', o.message\n"
        "import os, pathlib\n"
        f"c = sorted(pathlib.Path({str(demo_run)!r}).glob('step-*'))[-1]\n"
        "os.remove(c / 'drill-manifest.json')  # unsealed: verify reads the index for its structural proof\n"
        "assert verify_checkpoint(str(c)).result.status.value == 'passed'\n"
        "print('torch.distributed.checkpoint' in sys.modules)\n"
    )
    assert fresh_python(code) == "False"


def test_the_mirrors_read_an_index_as_dcp_does(demo_run: Path) -> None:
    ckpt = sorted(demo_run.glob("step-*"))[-1]
    data = (ckpt / ".metadata").read_bytes()
    ours, theirs = load_metadata(data), restricted_loads(data)
    assert set(ours.state_dict_metadata) == set(theirs.state_dict_metadata)
    for fqn, md in theirs.state_dict_metadata.items():
        mine = ours.state_dict_metadata[fqn]
        assert is_tensor(mine) == is_tensor(md) and is_bytes(mine) == is_bytes(md)
        if is_tensor(md):
            assert (mine.size, mine.properties.dtype) == (md.size, md.properties.dtype)
            assert [(c.offsets, c.sizes) for c in mine.chunks] == [(c.offsets, c.sizes) for c in md.chunks]
    flat = {(k.fqn, k.offset): (v.relative_path, v.offset, v.length) for k, v in theirs.storage_data.items()}
    assert {(k.fqn, k.offset): (v.relative_path, v.offset, v.length) for k, v in ours.storage_data.items()} == flat
