"""Property-based fuzzing (hypothesis) of every parser that reads checkpoint- or user-controlled
bytes. The only outcomes allowed are a result with findings or a clear, typed error — never a
crash, a hang, an allocation the input does not justify, or code run. Crashers found here are
fixed and kept as ``@example``s.

Examples per fuzzer: ``$DRILL_FUZZ_EXAMPLES`` (default 200; the README's figures name the run).
Derandomized, so CI sees the same inputs every run; set ``DRILL_FUZZ_EXAMPLES`` higher to look
further.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from drill.errors import DrillError
from drill.integrity.manifest import MANIFEST_NAME, ManifestInvalid, parse_manifest
from drill.integrity.structure import safetensors_structure
from drill.policy.load import PolicyError, parse_policy

EXAMPLES = int(os.environ.get("DRILL_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = settings(FUZZ, max_examples=max(20, EXAMPLES // 4))
"""For fuzzers that run a whole restore per example."""

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    """``data`` with bytes overwritten at (position, value) pairs and optionally truncated."""
    out = bytearray(data)
    for pos, value in edits:
        if out:
            out[pos % len(out)] = value
    return bytes(out[: cut % (len(out) + 1)] if cut is not None else out)


EDITS = st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), max_size=8)
CUT = st.none() | st.integers(0, 1 << 30)


# -- drill's manifest --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from drill.demo.config import DemoConfig
    from drill.demo.train import train

    run = tmp_path_factory.mktemp("fuzz") / "run"
    train(run, DemoConfig(steps=4, save_every=4, keep=1))
    return sorted(run.glob("step-*"))[-1]


@FUZZ
@given(edits=EDITS, cut=CUT)
@pytest.mark.slow
def test_manifest_bytes(sealed: Path, edits: list[tuple[int, int]], cut: int | None) -> None:
    _manifest_outcome(_mutate((sealed / MANIFEST_NAME).read_bytes(), edits, cut))


@FUZZ
@given(
    field=st.sampled_from(
        ["files", "chunk_size", "version", "format", "step", "frameworks", "path", "size", "chunks", "xxh3_128"]
    ),
    value=JSON,
)
@example(field="size", value=float("inf"))  # int(inf): OverflowError, once a crash
@example(field="chunk_size", value=float("nan"))
@pytest.mark.slow
def test_manifest_fields(sealed: Path, field: str, value: Any) -> None:
    doc = json.loads((sealed / MANIFEST_NAME).read_bytes())
    if field in ("path", "size", "chunks", "xxh3_128"):
        doc["files"][0][field] = value
    else:
        doc[field] = value
    _manifest_outcome(json.dumps(doc).encode())


def _manifest_outcome(data: bytes) -> None:
    try:
        parse_manifest(data)
    except ManifestInvalid as exc:
        assert exc.code.startswith("manifest-") and str(exc)


# -- DCP's .metadata, through the restricted unpickler, in a real restore and verify --------------
@pytest.fixture(scope="module")
def dcp_copy(sealed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("dcp") / sealed.name
    shutil.copytree(sealed, target)
    (target / MANIFEST_NAME).unlink()  # unsealed: .metadata decides everything
    return target


@SLOW
@given(edits=EDITS, cut=CUT)
@example(edits=[(53114483, 65)], cut=None)  # a storage key's name turned into a tuple: once a crash in verify
@pytest.mark.slow
def test_dcp_metadata_in_a_restore_and_a_verify(
    sealed: Path, dcp_copy: Path, edits: list[tuple[int, int]], cut: int | None
) -> None:
    import torch

    from drill.checkpoints import CheckpointRef
    from drill.formats import restore
    from drill.storage import LocalStorage
    from drill.verifier import verify_checkpoint

    (dcp_copy / ".metadata").write_bytes(_mutate((sealed / ".metadata").read_bytes(), edits, cut))
    ref = CheckpointRef(uri=str(dcp_copy), name=dcp_copy.name, step=None, format="dcp", mtime=0.0)
    try:
        result = restore(LocalStorage(), ref, torch.device("cpu"), memory_budget=1 << 30)
    except DrillError as exc:  # the memory budget refusing a claim: a clear error
        assert exc.exit_code and str(exc)
    else:
        assert result.metadata_error is not None or result.inventory or result.failures is not None
    verified = verify_checkpoint(str(dcp_copy))
    assert verified.result.status.value in {"passed", "failed"}


@FUZZ
@given(data=st.binary(max_size=512))
@example(data=b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f.")  # a frame claiming 2^63 bytes
@example(data=b"cposix\nsystem\n(S'touch /tmp/drill-fuzz-pwned'\ntR.")
def test_arbitrary_bytes_as_metadata(data: bytes) -> None:
    from drill.formats.dcp_types import load_metadata
    from drill.safe_pickle import restricted_loads

    for loads in (load_metadata, restricted_loads):
        try:
            loads(data)
        except Exception as exc:  # noqa: BLE001 - any refusal is fine here; a restore turns it into a finding
            assert not isinstance(exc, (SystemExit, KeyboardInterrupt))
    assert not Path("/tmp/drill-fuzz-pwned").exists()


# -- pickled DCP values (RNG states, loader state) ---------------------------------------------
@FUZZ
@given(edits=EDITS, cut=CUT)
def test_dcp_value_entries(sealed: Path, edits: list[tuple[int, int]], cut: int | None) -> None:
    from drill.formats.dcp_read import load_value

    blob = (sealed / "__0_0.distcp").read_bytes()[:4096]
    failures: list[Any] = []
    ok, _ = load_value(io.BytesIO(_mutate(blob, edits, cut)), "fuzzed", failures)
    assert ok or (len(failures) == 1 and failures[0].reason)


# -- safetensors headers -----------------------------------------------------------------------
@FUZZ
@given(
    header=st.dictionaries(st.text(max_size=8), JSON, max_size=4),
    data=st.binary(max_size=64),
    claim=st.none() | st.integers(0, 1 << 64 - 1),
)
@example(header={"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 1 << 62]}}, data=b"\0" * 4, claim=None)
@pytest.mark.slow
def test_safetensors_headers(header: dict[str, Any], data: bytes, claim: int | None) -> None:
    body = json.dumps(header).encode()
    blob = struct.pack("<Q", len(body) if claim is None else claim) + body + data
    findings, _ = safetensors_structure(memoryview(blob), "model.safetensors")
    assert all(f.message for f in findings)


# -- trainer_state.json and the safetensors weights of a real HF Trainer checkpoint --------------
@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="transformers is not installed: no real HF Trainer checkpoint")
    from tests.support import frameworks

    return frameworks.hf_trainer_run(tmp_path_factory.mktemp("hf") / "out") / "checkpoint-4"


@SLOW
@given(state=JSON, weights=EDITS)
@example(state={"global_step": [1, 2], "epoch": "x"}, weights=[])
@example(state={"global_step": float("nan")}, weights=[])
@pytest.mark.slow
def test_hf_trainer_state_and_weights(
    hf_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, state: Any, weights: list[tuple[int, int]]
) -> None:
    from drill.pipeline import NullRecorder, run_drill
    from drill.pipeline.request import DrillRequest
    from drill.replay import ReplaySpec

    run = tmp_path_factory.mktemp("hfrun")
    ckpt = Path(shutil.copytree(hf_checkpoint, run / hf_checkpoint.name))
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    header_end = 8 + struct.unpack("<Q", (ckpt / "model.safetensors").read_bytes()[:8])[0]
    model = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(_mutate(model[:header_end], weights, None) + model[header_end:])
    outcome = run_drill(
        DrillRequest(selector="latest", root=str(run), replay=ReplaySpec(enabled=False)), recorder=NullRecorder()
    )
    assert outcome.status.value in {"passed", "failed"}, outcome.message


# -- policy files ------------------------------------------------------------------------------
POLICY = {
    "name": "nightly",
    "checkpoints": {"root": "/ckpt/run"},
    "schedule": {"cron": "0 3 * * *"},
    "selection": {"strategy": "latest"},
}


@FUZZ
@given(section=st.sampled_from([*POLICY, "replay", "slo", "limits", "alerts", "contract", "allocation"]), value=JSON)
@pytest.mark.slow
def test_policy_fields(section: str, value: Any) -> None:
    _policy_outcome(yaml.safe_dump({**POLICY, section: value}))


@FUZZ
@given(text=st.text(max_size=300))
@example(text="a: &a [*a, *a, *a]")
@example(text="!!python/object/apply:os.system ['touch /tmp/drill-fuzz-pwned']")
def test_policy_text(text: str) -> None:
    _policy_outcome(text)
    assert not Path("/tmp/drill-fuzz-pwned").exists()


def _policy_outcome(text: str) -> None:
    try:
        parse_policy(text, "fuzz.yaml")
    except PolicyError as exc:
        assert str(exc).startswith("fuzz.yaml")


@pytest.mark.parametrize("numel", [0, 1, 1000, 3_000_000])
@pytest.mark.slow
def test_the_direct_zip_directory_reader_agrees_with_zipfile(numel: int) -> None:
    """torch.save's zips are listed straight from their central directory (no zipfile pass per
    entry): the same records as zipfile on real entries; a damaged end record or zip64 trailer
    is not read directly (zipfile, then the CRCs and the loader, judge it)."""
    import io
    import random
    import zipfile

    import torch

    from drill.formats import dcp_entries as e

    def by_zipfile(tail: memoryview, length: int) -> dict | None:
        try:
            with zipfile.ZipFile(e._Sparse(tail, length)) as z:
                infos = z.infolist()
        except Exception:  # noqa: BLE001
            return None
        names = {zi: zi.filename.split("/", 1)[1] if "/" in zi.filename else zi.filename for zi in infos}
        return {
            names[zi]: e.Record(
                names[zi],
                zi.header_offset,
                zi.file_size,
                zi.compress_type == 0 and zi.compress_size == zi.file_size,
                zi.CRC,
            )
            for zi in infos
        }

    buf = io.BytesIO()
    torch.save(torch.randn(numel), buf)
    data = buf.getvalue()
    tail = memoryview(data)[-min(len(data), e.TAIL_BYTES) :]
    assert e._plain_directory(tail, len(data)) == by_zipfile(tail, len(data)) is not None
    rng = random.Random(numel)
    for at in range(len(data) - 98, len(data)):  # the zip64 end record, its locator, the end record
        damaged = bytearray(data)
        damaged[at] ^= 1 << rng.randrange(8)
        t = memoryview(bytes(damaged))[-min(len(damaged), e.TAIL_BYTES) :]
        got = e._plain_directory(t, len(damaged))
        assert got is None or got == by_zipfile(t, len(damaged)), at
