"""The claims of SECURITY.md that no other test file already backs: secrets stay out of every
output, record and report; files drill creates are its owner's; side files load inert."""

from __future__ import annotations

import io
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import POSTGRES_URL

DRILL = str(Path(sys.executable).parent / "drill")
DB_PASSWORD = "pgpw-never-printed-7d1e"
WEBHOOK_TOKEN = "hooktoken-never-printed-93ab"
SEAL_KEY = "sealkey-never-printed-c0ffee-0123456789abcdef"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.postgres
@pytest.mark.slow
def test_no_secret_reaches_output_records_reports_metrics_or_spool(
    demo_run: Path, postgres_url: str, tmp_path: Path, private_spool: Path
) -> None:
    """A failing policy drill with every kind of secret in play — a database password in the
    URL, a seal key, a webhook URL with a token — then every place drill writes is searched."""
    from drill.records.db import upgrade

    url = postgres_url.replace(
        "://127.0.0.1", f"://postgres:{DB_PASSWORD}@127.0.0.1", 1
    )  # trust auth: any password works
    assert DB_PASSWORD in url
    upgrade(url)
    key = tmp_path / "seal.key"
    key.write_text(SEAL_KEY)
    env = {
        **os.environ,
        "DRILL_SEAL_KEY_FILE": str(key),
        "DRILL_TEST_HOOK": f"http://127.0.0.1:9/hooks/{WEBHOOK_TOKEN}",
    }
    for ckpt in sorted(demo_run.glob("step-*")):
        subprocess.run([DRILL, "seal", str(ckpt), "--force"], env=env, check=True, capture_output=True)
    _flip(sorted(demo_run.glob("step-*"))[-1] / "__0_0.distcp")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"name: secrets\ncheckpoints:\n  root: {demo_run}\nschedule:\n  cron: '0 3 * * *'\nselection:\n  strategy: latest\n"
        "replay:\n  steps: 1\nalerts:\n  webhook: env:DRILL_TEST_HOOK\n  timeout: 1s\n  retries: 1\n"
    )
    outputs = []
    for args in (
        ["run", "--policy", str(policy), "--db", url],
        ["run", "--root", str(demo_run), "--db", url, "--no-replay"],
        [
            "run",
            "--root",
            str(demo_run),
            "--db",
            "postgresql://postgres:" + DB_PASSWORD + "@127.0.0.1:9/nowhere?connect_timeout=2",
        ],
        ["verify", str(sorted(demo_run.glob("step-*"))[-1]), "--db", url],
        ["history", "--db", url, "--json"],
        ["report", "--db", url, "--format", "html", "-o", str(tmp_path / "r.html")],
        ["report", "--db", url, "--format", "md", "-o", str(tmp_path / "r.md")],
        ["report", "--db", url, "--format", "json", "-o", str(tmp_path / "r.json")],
        ["metrics", "--db", url, "--textfile", str(tmp_path / "drill.prom")],
        ["db", "status", "--db", url],
    ):
        done = subprocess.run(
            [DRILL, *args, "--debug"] if args[0] == "run" else [DRILL, *args], env=env, capture_output=True, text=True
        )
        outputs += [done.stdout, done.stderr]
        if args[0] == "report":
            assert done.returncode == 0, (args, done.stderr[-2000:])
    written = [
        p.read_text(errors="replace")
        for p in (tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json", tmp_path / "drill.prom")
    ]
    spooled = [p.read_text(errors="replace") for p in private_spool.rglob("*") if p.is_file()]
    assert any("digest-mismatch" in o for o in outputs)  # the drills really ran and failed
    haystack = "\n".join([*outputs, *written, *spooled, _database_text(url)])
    for secret in (DB_PASSWORD, WEBHOOK_TOKEN, SEAL_KEY):
        assert secret not in haystack, f"a secret leaked: {secret}"


def _database_text(url: str) -> str:
    """Every value of every row of every table, as text."""
    from sqlalchemy import MetaData, create_engine, select

    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    out = []
    with engine.connect() as conn:
        for table in meta.sorted_tables:
            for row in conn.execute(select(table)):
                out.append(" ".join(str(v) for v in row))
    engine.dispose()
    return "\n".join(out)


@pytest.mark.slow
def test_files_drill_creates_are_its_owners(demo_run: Path, tmp_path: Path) -> None:
    db = tmp_path / "records" / "drill.db"
    db.parent.mkdir()
    subprocess.run(
        [DRILL, "run", "--root", str(demo_run), "--db", f"sqlite:///{db}", "--no-replay", "-q"],
        check=True,
        capture_output=True,
    )
    report = tmp_path / "report.html"
    subprocess.run(
        [DRILL, "report", "--db", f"sqlite:///{db}", "-o", str(report)],
        check=True,
        capture_output=True,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert (
        stat.S_IMODE(report.stat().st_mode) == 0o644
    )  # a report is published: the umask decides (a web root's server reads it)
    private = tmp_path / "private.html"
    subprocess.run(
        [DRILL, "report", "--db", f"sqlite:///{db}", "-o", str(private)],
        check=True,
        capture_output=True,
        preexec_fn=lambda: os.umask(0o077),
    )
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    for wal in db.parent.glob("drill.db-*"):
        assert stat.S_IMODE(wal.stat().st_mode) & 0o077 == 0, wal


def test_the_default_database_directory_is_private(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    env.pop("DRILL_DB", None)
    subprocess.run([DRILL, "db", "status"], env=env, capture_output=True)
    dbs = list((tmp_path).rglob("drill.db"))
    assert dbs, "no default database was created"
    assert stat.S_IMODE(dbs[0].parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(dbs[0].stat().st_mode) == 0o600


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class TrainerArgs:
    """A class a trainer pickles into a side file (as Megatron pickles its argparse args)."""

    def __init__(self) -> None:
        self.lr = 3e-4


def test_side_files_load_inert_a_payload_is_refused_and_unknown_classes_are_stand_ins(tmp_path: Path) -> None:
    from drill.formats.inert import load_inert, plain
    from drill.formats.safeload import UnsafePickle

    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"iteration": 30, "args": TrainerArgs(), "w": torch.ones(2)}, buf)
    obj, stand_ins = load_inert(memoryview(buf.getvalue()))
    assert obj["iteration"] == 30 and torch.equal(obj["w"], torch.ones(2))
    assert any("TrainerArgs" in s for s in stand_ins)
    assert plain(obj["args"]) == {"lr": 3e-4} or "lr" in str(plain(obj["args"]))
    hostile = io.BytesIO()
    torch.save({"iteration": 30, "args": TrainerArgs(), "evil": _Payload(marker)}, hostile)
    with pytest.raises(UnsafePickle, match=r"(posix|nt)\.system"):  # what the trainer's torch.load would run
        load_inert(memoryview(hostile.getvalue()))
    assert not marker.exists()
    legacy = io.BytesIO()
    torch.save({"evil": _Payload(marker)}, legacy, _use_new_zipfile_serialization=False)
    for raw in (pickle.dumps(_Payload(marker)), legacy.getvalue()):  # once a hole: torch's legacy reader
        with pytest.raises(ValueError, match="not a torch.save zip archive"):  # calls pickle_module.load
            load_inert(memoryview(raw))
    assert not marker.exists()


class _TensorSubclass(torch.Tensor):
    """A tensor subclass, pickled through torch._tensor._rebuild_from_type_v2 (as DeepSpeed's
    ZeRO-3 partitions are): its class and state must never be constructed."""


class _HostileRebuild:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return torch._tensor._rebuild_from_type_v2, (os.system, torch.Tensor, (self.command,), {})


class _RebuildWith:
    def __init__(self, func: Any) -> None:
        self.func = func

    def __reduce__(self):
        return torch._tensor._rebuild_from_type_v2, (self.func, torch.Tensor, (), {})


def test_a_tensor_subclass_reads_as_a_plain_tensor_and_its_rebuild_runs_only_torchs_own(tmp_path: Path) -> None:
    from drill.formats.inert import StandIn, load_inert
    from drill.formats.safeload import UnsafePickle

    buf = io.BytesIO()
    torch.save({"flat": torch.arange(4.0).as_subclass(_TensorSubclass)}, buf)
    obj, stand_ins = load_inert(memoryview(buf.getvalue()))
    assert type(obj["flat"]) is torch.Tensor and torch.equal(obj["flat"], torch.arange(4.0))
    assert any("_TensorSubclass" in s for s in stand_ins)
    marker = tmp_path / "pwned"
    from drill.formats.inert import _Module

    # _rebuild_from_type_v2(a callable, Tensor, …): never called unless it is torch's own rebuilder.
    raw = pickle.dumps(_HostileRebuild(f"touch {marker}"), protocol=2)
    with pytest.raises(UnsafePickle):  # os.system itself is code: refused where it is named
        _Module(set()).Unpickler(io.BytesIO(raw)).load()
    raw = pickle.dumps(_RebuildWith(TrainerArgs), protocol=2)  # a class of the trainer's: a stand-in, never built
    out = _Module(set()).Unpickler(io.BytesIO(raw)).load()
    assert isinstance(out, StandIn) and not marker.exists()


def test_a_policy_runs_no_code_its_author_did_not_name(tmp_path: Path) -> None:
    """YAML tags that construct objects are refused; the replay entrypoint is the one way a
    policy names code, and the run directory cannot name one for it."""
    from drill.policy.load import PolicyError, parse_policy

    marker = tmp_path / "pwned"
    for text in (
        f"!!python/object/apply:os.system ['touch {marker}']",
        f"name: x\ncheckpoints: {{root: /r}}\nschedule: {{cron: '0 3 * * *'}}\nreplay: !!python/object/apply:os.system ['touch {marker}']\n",
    ):
        with pytest.raises(PolicyError):
            parse_policy(text, "evil.yaml")
    assert not marker.exists()


def test_postgres_url_fixture_is_local() -> None:
    assert "127.0.0.1" in POSTGRES_URL  # no test sends traffic anywhere else


@pytest.mark.parametrize("where", ["../outside.distcp", "/etc/hostname", "sub/../../outside.distcp"])
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused_not_read(
    demo_run: Path, sqlite_url: str, where: str
) -> None:
    from drill.safe_pickle import restricted_loads
    from drill.verifier import verify_checkpoint
    from tests.conftest import drill as _drill

    ckpt = sorted(demo_run.glob("step-*"))[-1]
    (ckpt / "drill-manifest.json").unlink()
    outside = demo_run / "outside.distcp"
    outside.write_bytes((ckpt / "__0_0.distcp").read_bytes())
    metadata = restricted_loads((ckpt / ".metadata").read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = where
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status.value == "failed"
    assert any(
        f.code == "path-escapes" or "escapes" in f.message or "outside" in f.message for f in outcome.findings
    ), [f.message for f in outcome.findings]
    assert outcome.bytes_read is None or outcome.bytes_read < outside.stat().st_size
    assert verify_checkpoint(str(ckpt)).result.status.value == "failed"


class _Scripted(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _torchscript_bytes() -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(_Scripted()), buf)
    return buf.getvalue()


@pytest.fixture
def jit_load_never_called(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """torch.load hands a TorchScript archive to torch.jit.load, which compiles and runs its
    code: record every call (none may happen while drill reads a checkpoint)."""
    calls: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append(args)
        raise AssertionError("torch.jit.load was called on checkpoint data")

    monkeypatch.setattr(torch.jit, "load", refuse)
    return calls


def test_a_torchscript_archive_never_reaches_torch_jit_load_through_any_reader(
    jit_load_never_called: list[object],
) -> None:
    """Every reader of checkpoint-controlled torch.save bytes: the inert side-file reader
    (Lightning meta.pt, Megatron common.pt) and the weights-only loader (HF's files,
    torch.save checkpoints) refuse a TorchScript archive as code, before torch sees it."""
    from drill.formats.inert import load_inert
    from drill.formats.safeload import UnsafePickle, load_torch

    archive = memoryview(_torchscript_bytes())
    for read in (load_inert, load_torch, lambda v: load_torch(v, ("numpy.ndarray",))):
        with pytest.raises(UnsafePickle, match="TorchScript"):
            read(archive)
    assert jit_load_never_called == []


def test_a_torchscript_checkpoint_file_is_an_unsafe_pickle_finding(
    tmp_path: Path, sqlite_url: str, jit_load_never_called: list[object]
) -> None:
    from tests.conftest import drill as _drill

    run = tmp_path / "run"
    run.mkdir()
    (run / "ckpt.pt").write_bytes(_torchscript_bytes())
    outcome = _drill(run, sqlite_url)
    assert outcome.status.value == "failed", outcome.message
    assert any(f.code == "unsafe-pickle" and "TorchScript" in f.message for f in outcome.findings), [
        (f.code, f.message) for f in outcome.findings
    ]
    assert jit_load_never_called == []


def test_the_inert_reader_imports_no_module_merely_named_like_numpy(tmp_path: Path) -> None:
    """A class is matched by its exact module, never a prefix: ``numpy_evil.XDType`` (a module
    a checkpoint's directory could plant) is a stand-in, not an import."""
    from drill.formats.inert import StandIn, _Module

    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "imported"
    (planted / "numpy_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass XDType:\n    pass\n")
    raw = b"\x80\x02cnumpy_evil\nXDType\nq\x00)\x81q\x01."  # protocol 2: GLOBAL numpy_evil.XDType, NEWOBJ
    sys.path.insert(0, str(planted))
    seen: set[str] = set()
    try:
        obj = _Module(seen).Unpickler(io.BytesIO(raw)).load()
    finally:
        sys.path.remove(str(planted))
        sys.modules.pop("numpy_evil", None)
    assert not marker.exists()
    assert isinstance(obj, StandIn) and seen == {"numpy_evil.XDType"}


HOSTILE_NAMES = (
    b"evil\x1b[2J\x1b[31mPASSED\x1b[0m\x07.bin",
    b"cr\rPASSED.bin",
    b"bidi\xe2\x80\xaetxt.exe",
    b"not-utf8-\xff\xfe.bin",
    b"c1-\xc2\x9b31m.bin",
    b"emoji-:fire:-:100:.bin",
)
"""File names a checkpoint's writer could choose: terminal escapes, a carriage return that
rewrites the line, a bidi override, bytes that are not UTF-8, a C1 CSI, rich's emoji codes."""


@pytest.mark.slow
def test_hostile_file_names_are_escaped_on_every_output_and_recorded_losslessly(
    demo_run: Path, db_url: str, cli, tmp_path: Path, private_spool: Path
) -> None:
    from tests.conftest import invoke, recorded

    ckpt = sorted(demo_run.glob("step-*"))[-1]
    for name in HOSTILE_NAMES:
        with open(os.path.join(os.fsencode(ckpt), name), "wb") as f:
            f.write(b"x")
    outputs = []
    for args in (
        ["run", "--root", str(demo_run), "--no-replay", "--db", db_url],
        ["verify", str(ckpt), "--db", db_url],
        ["show", "1", "--db", db_url],
        ["history", "--db", db_url],
        ["report", "--db", db_url, "-f", "md"],
        ["report", "--db", db_url, "-f", "html"],
    ):
        result = invoke(cli, *args)
        outputs.append(result.stdout + result.stderr)
    (drill_,) = recorded(db_url)
    assert drill_.status.value == "failed" and not list(private_spool.glob("*"))  # recorded, never spooled
    unlisted = {f.subject for f in drill_.findings if f.code == "file-unlisted"}
    assert "not-utf8-\\xff\\xfe.bin" in unlisted  # the stray bytes, readable back from the record
    text = "\n".join(outputs)
    assert "digest" in text or "file-unlisted" in text
    for bad in ("\x1b", "\r", "\x07", "\u202e", "\x9b", "\udcff"):
        assert bad not in text, repr(bad)
    assert "\\x1b[2J" in text and "\\u202e" in text
    assert "emoji-:fire:-:100:.bin" in text and "\U0001f525" not in text  # printed as named, never a glyph


def _zip_bomb(path: Path, inflated: int = 512 << 20) -> None:
    """A torch.save archive whose tensor record is deflated: a few hundred KB that inflate to
    ``inflated`` bytes (torch.save itself never compresses)."""
    import zipfile

    buf = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(4)}, "optimizer": {"state": {}, "param_groups": []}, "iter_num": 3}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data/0"):
                data = bytes(inflated)
            dst.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED)


@pytest.mark.slow
def test_a_zip_bomb_is_refused_before_it_is_inflated_in_run_and_verify(tmp_path: Path, sqlite_url: str) -> None:
    """Bounded in memory and time: a compressed record is a finding, never inflated (the peak
    stays far below what the bomb would take) — in the restore and in the structural proof."""
    import resource

    from drill.verifier import verify_checkpoint
    from tests.conftest import drill as _drill

    run = tmp_path / "run"
    run.mkdir()
    _zip_bomb(run / "ckpt.pt")
    assert (run / "ckpt.pt").stat().st_size < 8 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome = _drill(run, sqlite_url)
    verified = verify_checkpoint(str(run / "ckpt.pt"))
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) << 10
    assert outcome.status.value == "failed" and any(f.code == "zip-record-compressed" for f in outcome.findings), [
        (f.code, f.message) for f in outcome.findings
    ]
    assert any(f.code == "zip-record-compressed" for f in verified.result.findings)
    assert grew < 256 << 20


def test_the_memory_budget_binds_a_torch_save_checkpoint(tmp_path: Path, sqlite_url: str) -> None:
    from tests.conftest import drill as _drill

    run = tmp_path / "run"
    run.mkdir()
    torch.save(
        {"model": {"w": torch.zeros(1 << 16)}, "optimizer": {"state": {}, "param_groups": []}, "iter_num": 3},
        run / "ckpt.pt",
    )
    outcome = _drill(run, sqlite_url, memory_budget=16)
    assert outcome.status.value == "error" and "needs" in (outcome.message or ""), outcome.message


CODE = [
    "posix.system", "os.system", "nt.system", "builtins.eval", "builtins.exec", "builtins.getattr",
    "builtins.__import__", "builtins.open", "builtins.type", "subprocess.Popen", "subprocess.run",
    "logging.FileHandler", "shutil.rmtree", "importlib.import_module", "runpy.run_path", "socket.socket",
    "ctypes.CDLL", "pickle.loads", "marshal.loads", "types.FunctionType", "operator.attrgetter",
    "zipfile.ZipFile", "io.FileIO", "functools.reduce", "sys.exit", "webbrowser.open",
    "torch.load", "torch.hub.load", "torch.storage._load_from_bytes", "numpy.load", "numpy.fromfile",
]  # fmt: skip
DATA = [
    "collections.OrderedDict", "collections.defaultdict", "builtins.set", "builtins.frozenset",
    "builtins.bytearray", "builtins.complex", "builtins.object", "copyreg._reconstructor", "_codecs.encode",
    "argparse.Namespace", "datetime.datetime", "pathlib.PosixPath", "functools.partial",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter", "torch._tensor._rebuild_from_type_v2",
    "torch.serialization._get_layout", "torch.FloatStorage", "torch.Size", "torch.device", "torch.float32",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray.scalar", "numpy.ndarray", "numpy.dtype",
    "numpy.random._pickle.__generator_ctor", "numpy.random.bit_generator.__pyx_unpickle_SeedSequence",
    # not imported by drill: their classes cannot be judged without running the trainer's code
    "deepspeed.runtime.fp16.loss_scaler.LossScaler", "megatron.core.enums.ModelType",
]  # fmt: skip


@pytest.mark.parametrize("dotted", CODE)
def test_a_global_that_runs_code_is_code(dotted: str) -> None:
    import numpy  # noqa: F401 - imported by every drill that reads an RNG state
    import torch.hub  # noqa: F401

    from drill.safe_pickle import names_code

    module, name = dotted.rsplit(".", 1)
    assert names_code(module, name)


@pytest.mark.parametrize("dotted", DATA)
def test_data_and_the_rebuilders_are_not_code(dotted: str) -> None:
    import numpy  # noqa: F401

    from drill.safe_pickle import names_code

    module, name = dotted.rsplit(".", 1)
    before = set(sys.modules)
    assert not names_code(module, name)
    assert set(sys.modules) == before  # judged by name: nothing imported


class _Holder:
    def __init__(self, inner: Any) -> None:
        self.inner = inner


class _Indirect:
    """A payload reached by getattr, as gadget chains do: ``getattr(Path, "write_text")(…)``."""

    def __reduce__(self):
        return getattr, (Path, "write_text")


def _data_pkl(obj: Any, protocol: int) -> bytes:
    """The pickle of ``obj`` as torch.save writes it (tensors by persistent id), at ``protocol``."""
    import zipfile

    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    with zipfile.ZipFile(buf) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_a_payload_anywhere_in_a_pickle_is_named_and_nothing_runs(protocol: int, tmp_path: Path) -> None:
    """Where a hostile writer hides it — an item, an element, an object's state, a set, deep in
    a real optimizer state — the scan names it, at every protocol torch.save writes, constructing
    nothing; the real state itself names no code."""
    import collections
    import logging

    from drill.safe_pickle import code_named, pickled_globals

    marker = tmp_path / "pwned"
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "seen": {1, 2}, "args": _Holder(3)}
    assert code_named(_data_pkl(state, protocol)) == []
    for hide in (
        lambda p: {**state, "x": p},
        lambda p: collections.OrderedDict(a=[1, [2, (3, p)]]),
        lambda p: _Holder(_Holder(p)),
        lambda p: {"s": frozenset({1}), "deep": [[[[{"k": p}]]]]},
    ):
        data = _data_pkl(hide(_Payload(marker)), protocol)
        assert any(c.endswith(".system") for c in code_named(data)), pickled_globals(data)
    assert "logging.FileHandler" in code_named(_data_pkl(_Holder(logging.FileHandler), protocol))
    assert "builtins.getattr" in code_named(_data_pkl([_Indirect()], protocol))
    assert "torch.storage._load_from_bytes" in code_named(pickle.dumps(torch.ones(2), protocol=protocol))
    assert not marker.exists()


def test_a_broken_pickle_yields_what_it_named_before_the_break(tmp_path: Path) -> None:
    from drill.safe_pickle import code_named

    data = pickle.dumps([_Payload(tmp_path / "pwned"), list(range(100))], protocol=2)
    assert code_named(data[: len(data) // 2]) and code_named(b"\x80\x05garbage") == []
    assert not (tmp_path / "pwned").exists()


def test_the_plain_values_every_load_admits_are_data() -> None:
    """Each class in ``INERT_VALUES`` builds a value from its arguments; none of them is code."""
    import numpy  # noqa: F401

    from drill.formats.safeload import INERT_VALUES
    from drill.safe_pickle import names_code

    for dotted in INERT_VALUES:
        module, name = dotted.rsplit(".", 1)
        assert not names_code(module, name), dotted


def test_a_trainers_plain_values_load_and_anything_else_stays_refused() -> None:
    import collections
    import datetime
    import decimal
    import uuid

    import numpy as np

    from drill.formats.safeload import UnsafePickle, load_torch

    state = {
        "saved_at": datetime.datetime(2026, 12, 7, 3, 0, tzinfo=datetime.timezone.utc),
        "wall": datetime.timedelta(seconds=90),
        "torch_version": torch.__version__,
        "run_id": uuid.UUID(int=7),
        "lr": decimal.Decimal("0.0003"),
        "data_dir": Path("/data/shards"),
        "order": collections.OrderedDict(a=1),
        "seen": collections.Counter(a=2),
        "rng": np.random.get_state(),
        "weight": torch.ones(2),
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    loaded = load_torch(memoryview(buffer.getvalue()))
    assert loaded["saved_at"] == state["saved_at"] and loaded["run_id"] == state["run_id"]
    assert loaded["data_dir"] == Path("/data/shards") and loaded["seen"]["a"] == 2
    assert str(loaded["torch_version"]) == str(torch.__version__)
    assert (loaded["rng"][1] == state["rng"][1]).all()

    buffer = io.BytesIO()
    torch.save({"hook": _Holder(1)}, buffer)
    with pytest.raises(UnsafePickle, match="_Holder"):
        load_torch(memoryview(buffer.getvalue()))


def test_a_refused_side_value_is_a_finding_and_the_rest_is_still_checked(tmp_path: Path, sqlite_url: str) -> None:
    """A class outside the allow-list (a trainer's ``argparse.Namespace`` of arguments) is
    ``unsafe-pickle`` naming it and the file — and everything else in the file is still read
    (the class an inert stand-in, nothing constructed) and checked. Code is refused whole."""
    import argparse

    from tests.conftest import drill

    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    run = tmp_path / "run"
    run.mkdir()
    base = {"model": net.state_dict(), "optimizer": opt.state_dict(), "step": 1}
    torch.save({**base, "args": argparse.Namespace(lr=0.1)}, run / "step_1.pt")
    outcome = drill(run, sqlite_url)
    refused = [f for f in outcome.findings if f.code == "unsafe-pickle"]
    assert outcome.status == "failed" and refused and "argparse.Namespace" in refused[0].message
    assert refused[0].subject is not None and "step_1.pt" in refused[0].subject
    keys = outcome.check("keys")
    assert keys is not None and keys.evidence["parts"].get("model") == 2 and keys.evidence["parts"].get("optimizer")
    # Damage beside the refused value is still found.
    del base["optimizer"]["state"][0]["exp_avg"]
    torch.save({**base, "args": argparse.Namespace(lr=0.1)}, run / "step_1.pt")
    codes = [f.code for f in drill(run, sqlite_url).findings]
    assert "unsafe-pickle" in codes and "optimizer-slot-missing" in codes
    marker = tmp_path / "ran"
    torch.save({**base, "hook": _Payload(marker)}, run / "step_1.pt")
    outcome = drill(run, sqlite_url)
    assert outcome.status == "failed" and not marker.exists()
    assert outcome.check("keys") is None or outcome.check("keys").skipped
