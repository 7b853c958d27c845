"""The fault catalogue: corrupted, malicious and faulty inputs, each with the verdict it must get.

Every case runs the real CLI (in a subprocess where a hang or the working directory matters)
against a real demo run broken one way, and checks three things: the exit code and finding,
that no drill record was left ``running`` (no verdict lost), and that no code planted in the
checkpoint ran (its marker file does not exist). docs/faults.md is this list.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from drill import history
from drill.integrity.manifest import MANIFEST_NAME
from drill.integrity.manifest import seal_files as seal
from drill.safe_pickle import restricted_loads
from tests.conftest import invoke

ROOT = Path(__file__).resolve().parent.parent
DRILL = str(Path(sys.executable).parent / "drill")


@dataclass
class Case:
    id: str
    kind: str
    """The class of fault, as docs/faults.md groups them."""
    setup: Callable[[Path, Path], list[str]]
    """(run directory, scratch directory) → the drill command's arguments."""
    exit: int
    expect: str
    """A finding code in the output, or a phrase of the one-line error."""
    subprocess: bool = False
    cwd: str | None = None
    """``run`` to start drill from inside the run directory."""
    env: dict[str, str] = field(default_factory=dict)
    recorded: bool | None = None
    """Whether the command leaves a drill record: False for a mistake caught before one opens."""
    slow: bool = False
    """Seconds even in-process: left out of the fast lane (as every case run in a process of its own is)."""


class _Payload:
    """A pickle that would create the marker file if anything unpickled it unsafely."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _marker(tmp: Path) -> Path:
    return tmp / "code-ran"


def _ckpt(run: Path) -> Path:
    return run / "step-30"


def _args(run: Path, *extra: str) -> list[str]:
    return ["run", "--root", str(run), "--no-replay", *extra]


def _unseal(run: Path) -> None:
    os.remove(_ckpt(run) / MANIFEST_NAME)


def _mkfifo(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.mkfifo(path)


def _byte_entry(run: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of a non-tensor DCP entry (a pickled value)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = restricted_loads((_ckpt(run) / ".metadata").read_bytes())
    idx, info = next(
        (i, v) for i, v in md.storage_data.items() if isinstance(md.state_dict_metadata[i.fqn], BytesStorageMetadata)
    )
    return _ckpt(run) / info.relative_path, info.offset, info.length


def _replace_entry(run: Path, blob: bytes) -> None:
    """Overwrite a pickled-value entry in place with ``blob`` (padded to its length)."""
    path, offset, length = _byte_entry(run)
    assert len(blob) <= length, (len(blob), length)
    data = bytearray(path.read_bytes())
    data[offset : offset + length] = blob + b"\0" * (length - len(blob))
    path.write_bytes(data)


# -- setups ---------------------------------------------------------------------------------
def root_missing(run: Path, tmp: Path) -> list[str]:
    return _args(tmp / "absent")


def root_empty(run: Path, tmp: Path) -> list[str]:
    (tmp / "empty").mkdir()
    return _args(tmp / "empty")


def only_incomplete(run: Path, tmp: Path) -> list[str]:
    (tmp / "inc" / "step-5").mkdir(parents=True)
    (tmp / "inc" / "step-5" / "__0_0.distcp").write_bytes(b"partial")
    return _args(tmp / "inc")


def step_not_retained(run: Path, tmp: Path) -> list[str]:
    return _args(run, "-c", "step:7")


def verify_incomplete(run: Path, tmp: Path) -> list[str]:
    os.remove(_ckpt(run) / ".metadata")
    _unseal(run)
    return ["verify", str(_ckpt(run))]


def verify_empty(run: Path, tmp: Path) -> list[str]:
    (tmp / "empty").mkdir()
    return ["verify", str(tmp / "empty")]


def verify_run_root(run: Path, tmp: Path) -> list[str]:
    return ["verify", str(run)]


def seal_run_root(run: Path, tmp: Path) -> list[str]:
    return ["seal", str(run)]


def seal_incomplete(run: Path, tmp: Path) -> list[str]:
    os.remove(_ckpt(run) / ".metadata")
    _unseal(run)
    return ["seal", str(_ckpt(run))]


def fifo_beside_shards(run: Path, tmp: Path) -> list[str]:
    _mkfifo(_ckpt(run) / "stray.fifo")
    return _args(run)


def fifo_beside_shards_unsealed(run: Path, tmp: Path) -> list[str]:
    _unseal(run)
    _mkfifo(_ckpt(run) / "stray.fifo")
    return _args(run)


def fifo_as_shard(run: Path, tmp: Path) -> list[str]:
    _mkfifo(_ckpt(run) / "__0_1.distcp")
    return _args(run)


def fifo_as_shard_unsealed(run: Path, tmp: Path) -> list[str]:
    _unseal(run)
    _mkfifo(_ckpt(run) / "__0_1.distcp")
    return _args(run)


def fifo_as_manifest(run: Path, tmp: Path) -> list[str]:
    _mkfifo(_ckpt(run) / MANIFEST_NAME)
    return _args(run)


def fifo_as_metadata(run: Path, tmp: Path) -> list[str]:
    _mkfifo(_ckpt(run) / ".metadata")
    return _args(run, "-c", "step:30")


def fifo_verify(run: Path, tmp: Path) -> list[str]:
    _mkfifo(_ckpt(run) / "__0_0.distcp")
    return ["verify", str(_ckpt(run))]


def socket_in_checkpoint(run: Path, tmp: Path) -> list[str]:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(_ckpt(run) / "s"))  # left bound: a socket file, as a crashed daemon leaves one
    return _args(run)


def fifo_as_latest_pointer(run: Path, tmp: Path) -> list[str]:
    _mkfifo(run / "latest")
    return _args(run)


def planted_modules_in_cwd(run: Path, tmp: Path) -> list[str]:
    for name in ("xxhash", "numpy", "yaml", "sqlalchemy"):
        (run / f"{name}.py").write_text(f"open({str(_marker(tmp))!r}, 'w').write({name!r})\n")
    return ["run", "--root", ".", "--replay-steps", "1"]


def run_json_names_planted_module(run: Path, tmp: Path) -> list[str]:
    (run / "evil_replay.py").write_text(f"open({str(_marker(tmp))!r}, 'w').write('evil')\ndef build(**kw): pass\n")
    doc = json.loads((run / "run.json").read_text())
    doc["replay"] = "evil_replay:build"
    (run / "run.json").write_text(json.dumps(doc))
    return ["run", "--root", str(run), "--replay-steps", "1"]


def malicious_pickle_in_entry(run: Path, tmp: Path) -> list[str]:
    payload = pickle.dumps(_Payload(_marker(tmp)), protocol=2)
    _replace_entry(run, payload)
    seal(_ckpt(run), force=True)  # sealed after the fact: the bytes match, the pickle must still not run
    return _args(run)


def malicious_metadata(run: Path, tmp: Path) -> list[str]:
    (_ckpt(run) / ".metadata").write_bytes(pickle.dumps(_Payload(_marker(tmp))))
    seal(_ckpt(run), force=True)
    return _args(run)


def malicious_torch_save_file(run: Path, tmp: Path) -> list[str]:
    (tmp / "files").mkdir()
    torch.save(
        {"model": {"w": torch.ones(2)}, "optimizer": _Payload(_marker(tmp)), "iter_num": 3}, tmp / "files" / "ckpt.pt"
    )
    return _args(tmp / "files")


def corrupted_pickled_value(run: Path, tmp: Path) -> list[str]:
    path, offset, length = _byte_entry(run)
    data = bytearray(path.read_bytes())
    for i in range(offset + 80, offset + min(length, 400)):
        data[i] ^= 0x5A
    path.write_bytes(data)
    _unseal(run)
    return _args(run)


def manifest_is_a_directory(run: Path, tmp: Path) -> list[str]:
    os.remove(_ckpt(run) / MANIFEST_NAME)
    (_ckpt(run) / MANIFEST_NAME).mkdir()
    return _args(run)


def manifest_is_a_directory_verify(run: Path, tmp: Path) -> list[str]:
    manifest_is_a_directory(run, tmp)
    return ["verify", str(_ckpt(run))]


def metadata_claims_a_huge_tensor(run: Path, tmp: Path) -> list[str]:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata

    md = restricted_loads((_ckpt(run) / ".metadata").read_bytes())
    fqn, tmd = next((k, v) for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata))
    huge = torch.Size([1 << 40])
    md.state_dict_metadata[fqn] = TensorStorageMetadata(
        tmd.properties, huge, [ChunkStorageMetadata(torch.Size([0]), huge)]
    )
    (_ckpt(run) / ".metadata").write_bytes(pickle.dumps(md))
    _unseal(run)
    return _args(run)


def seal_force_over_a_link_out(run: Path, tmp: Path) -> list[str]:
    outside = tmp / "outside.json"
    outside.write_text("precious")
    os.remove(_ckpt(run) / MANIFEST_NAME)
    (_ckpt(run) / MANIFEST_NAME).symlink_to(outside)
    return ["seal", "--force", str(_ckpt(run))]


def bit_flip(run: Path, tmp: Path) -> list[str]:
    shard = _ckpt(run) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(data)
    return _args(run)


def truncated_shard(run: Path, tmp: Path) -> list[str]:
    shard = _ckpt(run) / "__0_1.distcp"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 3)
    return _args(run)


def deleted_shard(run: Path, tmp: Path) -> list[str]:
    os.remove(_ckpt(run) / "__0_0.distcp")
    return _args(run)


def forged_seal(run: Path, tmp: Path) -> list[str]:
    key = tmp / "seal.key"
    key.write_bytes(os.urandom(32))
    from drill.integrity.keys import load_key

    seal(_ckpt(run), force=True, key=load_key(key))
    bit_flip(run, tmp)
    seal(_ckpt(run), force=True)  # whoever can write the checkpoint re-seals it, without the key
    return _args(run, "--key-file", str(key))


def wrong_seal_key(run: Path, tmp: Path) -> list[str]:
    (tmp / "a.key").write_bytes(os.urandom(32))
    (tmp / "b.key").write_bytes(os.urandom(32))
    from drill.integrity.keys import load_key

    seal(_ckpt(run), force=True, key=load_key(tmp / "a.key"))
    return ["verify", str(_ckpt(run)), "--key-file", str(tmp / "b.key")]


def latest_pointer_ahead(run: Path, tmp: Path) -> list[str]:
    (run / "latest").write_text("step-40")
    return _args(run)


def no_rng(run: Path, tmp: Path) -> list[str]:
    from tests.test_formats import rewrite_dcp

    rewrite_dcp(_ckpt(run), lambda s: [s.pop(k) for k in [k for k in s if k.startswith("rng.")]])
    return ["run", "--root", str(run)]  # with the replay: the verdict is still the missing part's


def nan_in_a_moment(run: Path, tmp: Path) -> list[str]:
    from tests.test_formats import rewrite_dcp

    def poison(s: dict) -> None:
        key = next(k for k in s if k.endswith("exp_avg_sq"))
        s[key] = s[key].clone()
        s[key].view(-1)[0] = float("nan")

    rewrite_dcp(_ckpt(run), poison)
    return _args(run)


# -- the classes a second independent suite found (issue 22) ------------------------------------
def torchscript_checkpoint(run: Path, tmp: Path) -> list[str]:
    import io

    class Scripted(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(Scripted()), buf)
    (tmp / "ts").mkdir()
    (tmp / "ts" / "ckpt.pt").write_bytes(buf.getvalue())
    return _args(tmp / "ts")


def escape_sequence_in_a_name(run: Path, tmp: Path) -> list[str]:
    (_ckpt(run) / "evil\x1b[2J\x1b[32mPASSED\x1b[0m.bin").write_bytes(b"x")
    return _args(run)


def _policy(tmp: Path, body: str) -> list[str]:
    (tmp / "hostile.yaml").write_text(body)
    return ["policy", "check", str(tmp / "hostile.yaml")]


def alias_bomb_policy(run: Path, tmp: Path) -> list[str]:
    levels = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 7))
    return _policy(tmp, f"name: b\nl0: &l0 [x]\n{levels}checkpoints: {{root: /r}}\nschedule: {{cron: '0 3 * * *'}}\n")


def deeply_nested_policy(run: Path, tmp: Path) -> list[str]:
    return _policy(tmp, "name: d\ncheckpoints: {root: /r}\nreplay: " + "[" * 20000 + "]" * 20000 + "\n")


def object_tag_in_a_policy_value(run: Path, tmp: Path) -> list[str]:
    return _policy(
        tmp,
        f"name: t\ncheckpoints: {{root: !!python/object/apply:os.system ['touch {_marker(tmp)}']}}\nschedule: {{cron: '0 3 * * *'}}\n",
    )


def seal_claiming_one_byte_chunks(run: Path, tmp: Path) -> list[str]:
    from drill.integrity.manifest import self_digest

    path = _ckpt(run) / MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc.pop("manifest_xxh3_128")
    doc["chunk_size"] = 1  # a digest per byte, self-consistently digested: work the seal does not pay for
    doc["manifest_xxh3_128"] = self_digest(doc)
    path.write_text(json.dumps(doc))
    return ["verify", str(_ckpt(run))]


def snapshot_metadata_whose_aliases_multiply(run: Path, tmp: Path) -> list[str]:
    snapshot = tmp / "snapshot"
    (snapshot / "0").mkdir(parents=True)
    (snapshot / "0" / "x").write_bytes(b"x")
    chunk = "{tensor: {type: Tensor, location: 0/x, serializer: torch_save, dtype: torch.float32, shape: [1]}}"
    entries = [f"  e0: &c {{type: ChunkedTensor, chunks: [{', '.join([chunk] * 1000)}]}}"]
    entries += [f"  e{i}: *c" for i in range(1, 2000)]  # two million chunks to locate, in 100 KB
    (snapshot / ".snapshot_metadata").write_text("version: 0.0.0\nmanifest:\n" + "\n".join(entries) + "\n")
    return ["verify", str(snapshot)]


def sparse_terabyte_beside_the_shards(run: Path, tmp: Path) -> list[str]:
    with open(_ckpt(run) / "huge.bin", "wb") as f:
        f.truncate(1 << 40)
    return ["verify", str(_ckpt(run))]


def zip_bomb_checkpoint(run: Path, tmp: Path) -> list[str]:
    from tests.test_security import _zip_bomb

    (tmp / "bomb").mkdir()
    _zip_bomb(tmp / "bomb" / "ckpt.pt")
    return _args(tmp / "bomb")


def symlink_loop_in_a_checkpoint(run: Path, tmp: Path) -> list[str]:
    os.symlink("loop", _ckpt(run) / "loop")
    return _args(run)


def deep_directory_in_a_checkpoint(run: Path, tmp: Path) -> list[str]:
    deep = _ckpt(run) / "d"
    for _ in range(40):
        deep = deep / "d"
    deep.mkdir(parents=True)
    return _args(run)


def flip_under_a_recomputed_seal(run: Path, tmp: Path) -> list[str]:
    shard = _ckpt(run) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    seal(_ckpt(run), force=True)  # whoever flipped the bit recomputed the unkeyed manifest
    return _args(run)


def replay_module_that_does_not_exist(run: Path, tmp: Path) -> list[str]:
    return ["run", "--root", str(run), "--replay", "no_such_trainer.replay:build"]


def verify_that_proves_nothing(run: Path, tmp: Path) -> list[str]:
    (tmp / "checkpoint-5").mkdir()
    (tmp / "checkpoint-5" / "trainer_state.json").write_text('{"global_step": 5}')
    return ["verify", str(tmp / "checkpoint-5")]


NEW_SUITE = [
    Case("torchscript-checkpoint-file", "code from a checkpoint", torchscript_checkpoint, 1, "unsafe-pickle"),
    Case(
        "escape-sequences-in-a-file-name",
        "terminal injection",
        escape_sequence_in_a_name,
        1,
        "evil\\x1b[2J\\x1b[32mPASSED",
    ),
    Case(
        "policy-alias-bomb", "hostile policies", alias_bomb_policy, 2, "once its aliases are expanded", subprocess=True
    ),
    Case(
        "policy-nested-20000-deep",
        "hostile policies",
        deeply_nested_policy,
        2,
        "nested more than 32 levels deep",
        subprocess=True,
    ),
    Case(
        "policy-object-tag-in-a-value",
        "hostile policies",
        object_tag_in_a_policy_value,
        2,
        "plain values only",
        subprocess=True,
    ),
    Case(
        "sparse-terabyte-beside-the-shards",
        "bounded in time and memory",
        sparse_terabyte_beside_the_shards,
        1,
        "file-unlisted",
    ),
    Case(
        "seal-claiming-one-byte-chunks",
        "bounded in time and memory",
        seal_claiming_one_byte_chunks,
        1,
        "manifest-invalid",
    ),
    Case(
        "snapshot-metadata-whose-aliases-multiply",
        "bounded in time and memory",
        snapshot_metadata_whose_aliases_multiply,
        1,
        "once its aliases are expanded",
    ),
    Case(
        "zip-bomb-torch-save-file",
        "bounded in time and memory",
        zip_bomb_checkpoint,
        1,
        "zip-record-compressed",
        slow=True,
    ),
    Case("symlink-loop-in-a-checkpoint", "links and names", symlink_loop_in_a_checkpoint, 1, "leads back into itself"),
    Case(
        "directory-40-deep-in-a-checkpoint",
        "links and names",
        deep_directory_in_a_checkpoint,
        1,
        "nested deeper than any checkpoint layout",
    ),
    Case("bit-flip-under-a-recomputed-seal", "defence in depth", flip_under_a_recomputed_seal, 1, "crc-mismatch"),
    Case(
        "step-typo-is-not-a-record",
        "mistakes are not records",
        step_not_retained,
        3,
        "retained: 10, 20, 30",
        recorded=False,
    ),
    Case("missing-root-is-not-a-record", "mistakes are not records", root_missing, 3, "does not exist", recorded=False),
    Case(
        "replay-module-that-does-not-exist",
        "mistakes are not records",
        replay_module_that_does_not_exist,
        2,
        "no module 'no_such_trainer'",
        recorded=False,
    ),
    Case("verify-that-proves-nothing", "claims never overstate", verify_that_proves_nothing, 8, "unproven"),
]


CASES = [
    Case("root-missing", "nothing to drill", root_missing, 3, "does not exist"),
    Case("root-empty", "nothing to drill", root_empty, 3, "no checkpoint under"),
    Case("only-incomplete-saves", "nothing to drill", only_incomplete, 3, "only incomplete saves"),
    Case("step-not-retained", "nothing to drill", step_not_retained, 3, "retained: 10, 20, 30"),
    Case("verify-an-incomplete-save", "not a checkpoint", verify_incomplete, 1, "incomplete-save"),
    Case("verify-an-empty-directory", "not a checkpoint", verify_empty, 3, "empty directory"),
    Case(
        "verify-a-run-root", "not a checkpoint", verify_run_root, 2, "holding checkpoints (step-10, step-20, step-30)"
    ),
    Case("seal-a-run-root", "not a checkpoint", seal_run_root, 2, "holding checkpoints (step-10, step-20, step-30)"),
    Case("seal-an-incomplete-save", "not a checkpoint", seal_incomplete, 1, "incomplete save"),
    Case("fifo-beside-the-shards", "hangs", fifo_beside_shards, 1, "file-unlisted", subprocess=True),
    Case(
        "fifo-beside-the-shards-unsealed", "hangs", fifo_beside_shards_unsealed, 1, "file-not-regular", subprocess=True
    ),
    Case("fifo-as-a-shard", "hangs", fifo_as_shard, 1, "file-not-regular", subprocess=True),
    Case("fifo-as-a-shard-unsealed", "hangs", fifo_as_shard_unsealed, 1, "file-not-regular", subprocess=True),
    Case("fifo-as-the-manifest", "hangs", fifo_as_manifest, 1, "manifest-unreadable", subprocess=True),
    Case("fifo-as-the-metadata", "hangs", fifo_as_metadata, 3, "incomplete save", subprocess=True),
    Case("fifo-verify", "hangs", fifo_verify, 1, "file-not-regular", subprocess=True),
    Case("socket-in-a-checkpoint", "hangs", socket_in_checkpoint, 1, "file-unlisted", subprocess=True),
    Case("fifo-as-the-latest-pointer", "hangs", fifo_as_latest_pointer, 0, "PASSED", subprocess=True),
    Case(
        "planted-modules-in-the-working-directory",
        "code from the run directory",
        planted_modules_in_cwd,
        0,
        "PASSED",
        subprocess=True,
        cwd="run",
    ),
    Case(
        "run-json-names-a-planted-module",
        "code from the run directory",
        run_json_names_planted_module,
        1,
        "replay-entrypoint-refused",
        subprocess=True,
    ),
    Case("malicious-pickle-in-an-entry", "malicious pickles", malicious_pickle_in_entry, 1, "unsafe-pickle"),
    Case("malicious-metadata", "malicious pickles", malicious_metadata, 1, "unsafe-pickle"),
    Case("malicious-torch-save-file", "malicious pickles", malicious_torch_save_file, 1, "unsafe-pickle"),
    Case("corrupted-pickled-value", "damage", corrupted_pickled_value, 1, "did not load: record archive/"),
    Case("manifest-is-a-directory", "damage", manifest_is_a_directory, 1, "manifest-unreadable"),
    Case("manifest-is-a-directory-verify", "damage", manifest_is_a_directory_verify, 1, "manifest-unreadable"),
    Case("metadata-claims-a-2^40-element-tensor", "damage", metadata_claims_a_huge_tensor, 1, "metadata-implausible"),
    Case("seal-force-over-a-link-out", "damage", seal_force_over_a_link_out, 1, "resolves outside it"),
    Case("bit-flip", "damage", bit_flip, 1, "digest-mismatch"),
    Case("truncated-shard", "damage", truncated_shard, 1, "size-mismatch"),
    Case("deleted-shard", "damage", deleted_shard, 1, "file-missing"),
    Case("forged-seal", "forged seals", forged_seal, 1, "manifest-unauthenticated"),
    Case("wrong-seal-key", "forged seals", wrong_seal_key, 1, "manifest-hmac-mismatch"),
    Case("latest-pointer-ahead", "resume state", latest_pointer_ahead, 1, "pointer-ahead"),
    Case("missing-rng", "resume state", no_rng, 1, "part-missing"),
    Case("nan-in-an-adam-moment", "resume state", nan_in_a_moment, 1, "non-finite"),
    *NEW_SUITE,
]


def _run(case: Case, run: Path, tmp: Path, db: str) -> tuple[int, str]:
    args = case.setup(run, tmp)
    args += ["--db", db] if args[0] not in ("seal", "policy") else []
    if not case.subprocess:
        res = invoke(CliRunner(), *args)
        return res.exit_code, res.stdout + res.stderr
    env = {**os.environ, **case.env, "PYTHONPATH": str(ROOT)}
    cwd = str(run) if case.cwd == "run" else str(tmp)
    done = subprocess.run([DRILL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.subprocess or c.slow else []) for c in CASES]
)  # the cases drill answers in-process run in the fast lane too; those needing a process of their own are slow
def test_fault(case: Case, demo_run: Path, tmp_path: Path, sqlite_url: str) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code, output = _run(case, demo_run, scratch, sqlite_url)
    assert code == case.exit, output
    assert case.expect in output, output
    assert "Traceback" not in output
    assert not _marker(scratch).exists(), "code from the checkpoint ran"
    recorded = history(db=sqlite_url)
    assert all(d.status != "running" for d in recorded), "a drill was left running: its verdict was lost"
    if case.recorded is False:
        assert recorded == [], "a mistake became an audit record"
    if case.id == "seal-force-over-a-link-out":
        assert (scratch / "outside.json").read_text() == "precious"
    if case.id == "seal-a-run-root":
        assert not (demo_run / MANIFEST_NAME).exists()


def test_the_documented_catalogue_is_this_suite() -> None:
    """Its counts and codes are generated (docs/generate.py); each class is also described by hand."""
    readme = (ROOT / "docs" / "faults.md").read_text()
    described = readme.split("<!-- end generated: fault-cases -->")[1]
    for kind in {case.kind for case in CASES}:
        assert f"| {kind} |" in described, f"docs/faults.md does not describe the class {kind!r}"
    assert f"**{len(CASES)} cases in " in readme
    fuzzers = (Path(__file__).parent / "test_fuzz.py").read_text()
    for name in re.findall(r"^def (test_\w+)", fuzzers, re.M):
        assert f"`{name}`" in readme, f"docs/faults.md's fuzzing table lacks {name}"


@pytest.mark.slow
def test_hugging_face_run_directories(tmp_path: Path, sqlite_url: str) -> None:
    """HF's example scripts end with save_model() and save_state(): a final export at the top
    of the output directory, beside checkpoint-N/ — the checkpoints are what drill drills."""
    pytest.importorskip("transformers", reason="transformers is not installed: no real HF run")
    from tests.support.frameworks import hf_trainer_run

    out = hf_trainer_run(tmp_path / "out", finish=True)
    assert (out / "model.safetensors").exists() and (out / "trainer_state.json").exists()
    runner = CliRunner()
    latest = invoke(runner, "run", "--root", str(out), "--no-replay", "--json", "--db", sqlite_url)
    assert latest.exit_code == 0, latest.stdout + latest.stderr
    doc = json.loads(latest.stdout)
    assert doc["checkpoint"]["name"] == "checkpoint-4"
    discover = next(c for c in doc["checks"] if c["name"] == "discover")
    assert discover["evidence"]["complete"] == ["checkpoint-2", "checkpoint-4"]
    assert "final model export" in discover["summary"]
    by_step = invoke(runner, "run", "--root", str(out), "-c", "step:2", "--no-replay", "--db", sqlite_url)
    assert by_step.exit_code == 0, by_step.stderr
    by_path = invoke(runner, "run", "-c", str(out / "checkpoint-4"), "--no-replay", "--db", sqlite_url)
    assert by_path.exit_code == 0, by_path.stderr
    shutil.rmtree(out / "checkpoint-2")
    shutil.rmtree(out / "checkpoint-4")
    nothing = invoke(runner, "run", "--root", str(out), "--no-replay", "--db", sqlite_url)
    assert nothing.exit_code == 3 and "only a final model export" in nothing.stderr
