"""The head start of ``drill verify`` (drill.integrity.ahead): a sealed checkpoint's files hash
while the verification still asks what the checkpoint is — with the very verdict, findings and
evidence of a verification that hashes them after, for every fault; never opening what the
directory does not list as a regular file; and never leaving a worker behind."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import drill.integrity.ahead as ahead
from drill.integrity.manifest import MANIFEST_NAME
from drill.integrity.manifest import seal_files as seal
from drill.integrity.sampling import SampleSpec
from drill.storage import LocalStorage
from drill.storage.listed import ListedOnce
from drill.verifier import VerifyOutcome, verify_checkpoint

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")

CHUNK = 64 << 10


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A flat sealed DCP checkpoint of many small files and one of several chunks, written by
    DCP itself (one file per tensor), sealed in small chunks so the large file is spanned."""
    import drill.sdk

    g = torch.Generator().manual_seed(0)
    state = {f"p{i}": torch.randn(256, generator=g) for i in range(40)}
    state["big"] = torch.randn(5 * CHUNK // 4 + 77, generator=g)
    ckpt = tmp_path / "step-40"
    drill.sdk.save(state, str(ckpt), no_dist=True, single_file_per_rank=False, sync_files=False)
    seal(ckpt, chunk_size=CHUNK, force=True)
    return ckpt


def _big(ckpt: Path) -> Path:
    return max((p for p in ckpt.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)


def _small(ckpt: Path) -> Path:
    return min((p for p in ckpt.iterdir() if p.suffix == ".distcp"), key=lambda p: (p.stat().st_size, p.name))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(data)


def _edit_seal(ckpt: Path) -> None:
    doc = json.loads((ckpt / MANIFEST_NAME).read_text())
    doc["step"] = 41
    (ckpt / MANIFEST_NAME).write_text(json.dumps(doc))


def _fifo(ckpt: Path) -> None:
    victim = _small(ckpt)
    victim.unlink()
    os.mkfifo(victim)


def _link_inside(ckpt: Path) -> None:
    victim = _small(ckpt)
    victim.rename(ckpt / "moved")
    victim.symlink_to("moved")


FAULTS: dict[str, Callable[[Path], None]] = {
    "none": lambda ckpt: None,
    "a bit flipped in a small file": lambda ckpt: _flip(_small(ckpt), 100),
    "a bit flipped in a spanned file": lambda ckpt: _flip(_big(ckpt), 3 * CHUNK + 5),
    "a small file truncated": lambda ckpt: os.truncate(_small(ckpt), 10),
    "a spanned file truncated": lambda ckpt: os.truncate(_big(ckpt), 2 * CHUNK),
    "a small file extended": lambda ckpt: _small(ckpt).write_bytes(_small(ckpt).read_bytes() + b"x"),
    "a file deleted": lambda ckpt: _small(ckpt).unlink(),
    "a file emptied": lambda ckpt: _small(ckpt).write_bytes(b""),
    "an unlisted file added": lambda ckpt: (ckpt / "stray.bin").write_bytes(b"stray"),
    "the seal edited by hand": _edit_seal,
    "the seal not JSON": lambda ckpt: (ckpt / MANIFEST_NAME).write_text("{"),
    "a shard replaced by a FIFO": _fifo,
    "a shard replaced by a link inside": _link_inside,
    "a sub-directory added": lambda ckpt: (ckpt / "extra").mkdir(),
    "a framework manifest naming a path out": lambda ckpt: (ckpt / "integrity.json").write_text(
        json.dumps({"algorithm": "sha256", "files": {"../../etc/hostname": "0" * 64}})
    ),
}
NO_HEAD_START = {
    "a shard replaced by a FIFO",
    "a shard replaced by a link inside",
    "a sub-directory added",
    "a framework manifest naming a path out",
}
"""Directories holding more than regular files, or a manifest that could lead out: nothing is
opened before the verification has listed and planned."""


def _comparable(outcome: VerifyOutcome) -> tuple:
    r = outcome.result
    evidence = {k: v for k, v in r.evidence.items() if k != "seconds"}
    return outcome.status, r.summary, [(f.code, f.subject, f.message) for f in r.findings], evidence


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the drill command: this process may fork its hashing workers — on two cores free,
    however busy the machine running the suite is."""
    monkeypatch.setattr("drill.proc.may_fork", lambda: True)
    monkeypatch.setattr(ahead, "free_cores", lambda cap: 2)


@pytest.mark.parametrize("apart", [False, True], ids=["listed in place", "listed apart"])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_head_start_changes_no_verdict_finding_or_evidence(
    checkpoint: Path, fault: str, apart: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with the directory listed in a forked child while the seal parses (as one of
    thousands of files is): the verification's listing is the child's."""
    FAULTS[fault](checkpoint)
    if apart:
        monkeypatch.setattr("drill.storage.apart.MANY_ENTRIES", 0)
    plain = verify_checkpoint(str(checkpoint))  # this process may not fork: no head start
    started: list[object] = []
    real = ahead._start

    def spied(storage: object, uri: str) -> object:
        started.append(got := real(storage, uri))  # type: ignore[arg-type]
        return got

    monkeypatch.setattr("drill.proc.may_fork", lambda: True)
    monkeypatch.setattr(ahead, "free_cores", lambda cap: 2)
    monkeypatch.setattr(ahead, "_start", spied)
    with_head_start = verify_checkpoint(str(checkpoint))
    assert _comparable(with_head_start) == _comparable(plain)
    assert (started[0] is None) == (fault in NO_HEAD_START), started
    if started[0] is not None:
        assert (started[0].listed_apart is not None) is apart  # type: ignore[attr-defined]
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no worker, no lister left


def _hashed_after(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    """What the verification hashes after its plan (path → size), call by call."""
    import drill.integrity.verify as verify

    calls: list[dict[str, int]] = []
    real = verify.hash_files

    def hash_files(storage: object, uri: str, sizes: dict[str, int], *args: object, **kw: object) -> object:
        calls.append(dict(sizes))
        return real(storage, uri, sizes, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(verify, "hash_files", hash_files)
    return calls


def test_the_files_hashed_ahead_are_not_hashed_again(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    after = _hashed_after(monkeypatch)
    outcome = verify_checkpoint(str(checkpoint))
    assert outcome.status == "passed" and outcome.result.evidence["files_verified"] == 42
    assert after == []


def test_a_file_changed_since_it_was_hashed_ahead_is_hashed_again_as_listed(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head start hashed each file at its sealed size; one the listing finds at another
    size is the size mismatch it is — and is not read again (a sparse terabyte claiming to be a
    shard costs nothing)."""
    victim = _small(checkpoint)
    real = ahead._start

    def then_truncated(storage: object, uri: str) -> object:
        got = real(storage, uri)  # type: ignore[arg-type]
        assert got is not None and got.hashing is not None
        got.hashing.results()  # hashed, at its sealed size
        os.truncate(victim, 3)
        return got

    again = _hashed_after(monkeypatch)
    monkeypatch.setattr(ahead, "_start", then_truncated)
    outcome = verify_checkpoint(str(checkpoint))
    assert [(f.code, f.subject) for f in outcome.result.findings] == [("size-mismatch", victim.name)]
    assert again == []


def test_nothing_starts_ahead_for_a_sample_or_where_the_process_may_not_fork(checkpoint: Path, forking: None) -> None:
    storage = ListedOnce(LocalStorage())
    with ahead.head_start(storage, str(checkpoint), SampleSpec("all")) as started:
        assert started is not None and started.manifest is not None and started.hashing is not None
    with ahead.head_start(storage, str(checkpoint), SampleSpec("auto")) as started:
        assert started is None


def test_a_file_is_spanned_ahead_by_its_size_on_storage_never_by_the_size_sealed(
    checkpoint: Path, forking: None
) -> None:
    """A file of several chunks is cut into spans by its size on storage: one the seal claims
    larger than it is (a seal of a few megabytes could claim chunks of petabytes, and so
    millions of spans) is left to the listing, and the verification says what it is."""
    from drill.integrity.manifest import self_digest

    doc = json.loads((checkpoint / MANIFEST_NAME).read_text())
    victim = _small(checkpoint).name
    for f in doc["files"]:
        if f["path"] == victim:
            f["size"] = 1600 * CHUNK  # 100 MiB claimed, in 1,600 chunk digests
            f["chunks"] = f["chunks"] * 1600
    doc.pop("manifest_xxh3_128")
    doc["manifest_xxh3_128"] = self_digest(doc)
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(doc))
    with ahead.head_start(ListedOnce(LocalStorage()), str(checkpoint), SampleSpec("all")) as started:
        assert started is not None and started.manifest is not None
        assert victim not in started.sizes and started.sizes[_big(checkpoint).name] == _big(checkpoint).stat().st_size
        assert len(started.sizes) == 41  # every file but the one claimed larger
    result = verify_checkpoint(str(checkpoint)).result
    assert [(f.code, f.subject) for f in result.findings] == [("size-mismatch", victim)]


def test_one_worker_starts_ahead_on_one_free_core(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many workers as cores are free: with another process holding the other core, one
    worker hashes ahead — and the verification is the one without it."""
    plain = verify_checkpoint(str(checkpoint), sample=SampleSpec("auto"))  # a sample: nothing ahead
    monkeypatch.setattr(ahead, "free_cores", lambda cap: 1)
    with ahead.head_start(ListedOnce(LocalStorage()), str(checkpoint), SampleSpec("all")) as started:
        assert started is not None and started.hashing is not None and started.hashing.workers == 1
        assert len(_children()) == 1
    outcome = verify_checkpoint(str(checkpoint))
    assert outcome.status == plain.status == "passed" and outcome.result.evidence["files_verified"] == 42
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_nothing_starts_ahead_without_a_seal_or_of_a_file(checkpoint: Path, forking: None) -> None:
    storage = ListedOnce(LocalStorage())
    (checkpoint / MANIFEST_NAME).unlink()
    with ahead.head_start(storage, str(checkpoint), SampleSpec("all")) as started:
        assert started is not None and started.manifest is None and started.hashing is None
    with ahead.head_start(storage, str(_big(checkpoint)), SampleSpec("all")) as started:
        assert started is None
    with ahead.head_start(storage, str(checkpoint / "absent"), SampleSpec("all")) as started:
        assert started is None


def test_nothing_starts_ahead_in_a_directory_of_more_entries_than_a_listing_takes(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = len(list(checkpoint.iterdir()))
    monkeypatch.setattr(ahead, "MAX_ENTRIES", entries - 1)
    with ahead.head_start(ListedOnce(LocalStorage()), str(checkpoint), SampleSpec("all")) as started:
        assert started is None
    monkeypatch.setattr(ahead, "MAX_ENTRIES", entries)
    with ahead.head_start(ListedOnce(LocalStorage()), str(checkpoint), SampleSpec("all")) as started:
        assert started is not None


def test_no_worker_outlives_a_verification_that_ends_early(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verification that raises after the head start (here: the path is not what it seemed)
    leaves no worker running: each is killed and reaped on the way out."""
    import drill.verifier as verifier

    def refuses(*args: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(verifier, "classify", refuses)
    with pytest.raises(KeyboardInterrupt):
        verify_checkpoint(str(checkpoint))
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no child left, running or unreaped


def test_a_seal_that_fails_its_own_digest_stops_the_head_start(checkpoint: Path, forking: None) -> None:
    _edit_seal(checkpoint)
    with ahead.head_start(ListedOnce(LocalStorage()), str(checkpoint), SampleSpec("all")) as started:
        assert started is not None and started.hashing is None
        assert started.error is not None and started.error.code == "manifest-digest-mismatch"
        with pytest.raises(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)


def test_the_callers_work_meanwhile_runs_while_the_files_hash(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``meanwhile`` runs once, while the workers hash and before anything waits for their
    digests (drill verify imports its renderer there instead of after the proof)."""
    import drill.integrity.mapped as mapped

    order: list[str] = []
    collect = mapped._collect

    def collected(pipes: dict) -> None:
        order.append("waited for the workers")
        collect(pipes)

    def meanwhile() -> None:
        order.append(f"meanwhile, {sum(1 for _ in _children())} workers running")

    monkeypatch.setattr(mapped, "_collect", collected)
    outcome = verify_checkpoint(str(checkpoint), meanwhile=meanwhile)
    assert outcome.exit_code == 0
    assert order[0] == "meanwhile, 2 workers running" and order[1:] == ["waited for the workers"]


def _children() -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()]


def _parent(pid: str) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("where", ["unsealed", "single file", "sampled"])
def test_meanwhile_runs_once_where_nothing_hashes_ahead(checkpoint: Path, forking: None, where: str) -> None:
    calls: list[None] = []
    if where == "unsealed":
        (checkpoint / MANIFEST_NAME).unlink()
        verify_checkpoint(str(checkpoint), meanwhile=lambda: calls.append(None))
    elif where == "single file":
        verify_checkpoint(str(_small(checkpoint)), meanwhile=lambda: calls.append(None))
    else:
        verify_checkpoint(str(checkpoint), sample=SampleSpec("auto"), meanwhile=lambda: calls.append(None))
    assert calls == [None]


def test_work_meanwhile_that_fails_leaves_no_worker_behind(checkpoint: Path, forking: None) -> None:
    def fails() -> None:
        raise RuntimeError("the caller's own work failed")

    with pytest.raises(RuntimeError):
        verify_checkpoint(str(checkpoint), meanwhile=fails)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


# A head start begun before the verification is asked for: `drill verify`'s console script
# begins one before it loads its command line (drill.cli.early).


@pytest.mark.parametrize(
    ("argv", "full"),
    [
        (["verify", "ckpt"], True),
        (["verify", "ckpt", "--db", "sqlite:///x.db", "--json"], True),
        (["verify", "ckpt", "--require-sealed", "--timeout", "60"], True),
        (["verify"], False),
        (["verify", "--json", "ckpt"], False),
        (["verify", "ckpt", "--sample", "auto"], False),
        (["verify", "ckpt", "--sample=10%"], False),
        (["verify", "ckpt", "--help"], False),
        (["verify", "ckpt", "-h"], False),
        (["verify", "ckpt", "--", "other"], False),
        (["seal", "ckpt"], False),
        (["run", "--checkpoint", "latest"], False),
        ([], False),
    ],
)
def test_only_a_full_verification_of_the_path_named_first_begins_before_the_command_line(
    argv: list[str], full: bool
) -> None:
    from drill.cli.early import full_verification

    assert full_verification(argv) is full


def test_a_head_start_begun_before_the_verification_is_taken_and_not_hashed_again(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    begun = ahead.begin(str(checkpoint))
    assert begun is not None and begun.hashing is not None and begun.checkpoint == str(checkpoint)
    started: list[object] = []
    monkeypatch.setattr(ahead, "_start", lambda *a: started.append(a))
    after = _hashed_after(monkeypatch)
    outcome = verify_checkpoint(str(checkpoint), begun=begun)
    assert outcome.status == "passed" and outcome.result.evidence["files_verified"] == 42
    assert after == [] and started == []  # its digests taken; no second head start
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


@pytest.mark.parametrize("why", ["another checkpoint", "a sample", "a path refused first"])
def test_a_head_start_begun_for_another_verification_is_stopped_and_unused(
    checkpoint: Path, forking: None, tmp_path: Path, why: str
) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    _flip(_big(checkpoint), 3 * CHUNK + 5)  # what the head start hashes, damaged: its digests must not be used
    begun = ahead.begin(str(checkpoint))
    assert begun is not None and begun.hashing is not None
    if why == "another checkpoint":
        outcome = verify_checkpoint(str(other), begun=begun)
        assert outcome.status == "passed" and outcome.result.evidence["files_verified"] == 42
    elif why == "a sample":
        outcome = verify_checkpoint(str(other), sample=SampleSpec("auto"), begun=begun)
        assert outcome.status == "passed"
    else:
        from drill.errors import NothingToDrill

        with pytest.raises(NothingToDrill):
            verify_checkpoint(str(tmp_path / "empty-dir-that-is-not-there"), begun=begun)
    assert begun.hashing is None or begun.hashing._mapped is None or not begun.hashing._mapped._pids
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # its workers stopped and reaped


def test_nothing_is_begun_on_object_storage_or_where_a_head_start_could_not_start(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No object-store client is made before the command line loads; what fails this early (here
    the seal's read itself) is not raised — the verification meets it again and says what it is."""
    import drill.storage as storage

    def no_client(*args: object, **kw: object) -> object:
        raise AssertionError("a storage client made before the command line")

    monkeypatch.setattr(storage, "storage_for", no_client)
    assert ahead.begin("s3://bucket/run/step-40") is None
    assert ahead.begin(str(checkpoint / "absent")) is None
    assert ahead.begin(str(_big(checkpoint))) is None

    def unreadable(*args: object, **kw: object) -> object:
        raise PermissionError(13, "Permission denied", str(checkpoint / MANIFEST_NAME))

    monkeypatch.setattr(ahead, "read_manifest", unreadable)
    assert ahead.begin(str(checkpoint)) is None
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


CONSOLE = r"""
import atexit, os, sys
def no_child_left():
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        print("no child left", file=sys.stderr)
atexit.register(no_child_left)  # registered first: runs after every handler drill registers
import drill.integrity.ahead as ahead
ahead.free_cores = lambda cap: 2  # two cores free, however busy the machine running the suite
took = ahead.HeadStart.take
def take(self, *a, **kw):
    print("head start taken, begun before the command line:", "typer" not in sys.modules_at_begin, file=sys.stderr)
    return took(self, *a, **kw)
ahead.HeadStart.take = take
begin = ahead.begin
def spied(uri):
    sys.modules_at_begin = set(sys.modules)
    return begin(uri)
ahead.begin = spied
sys.argv = ["drill", *sys.argv[1:]]
from drill.cli import main
main()
"""


@pytest.mark.parametrize("tail", [[], ["--bogus"]])
def test_the_console_script_begins_a_full_verification_before_its_command_line(
    checkpoint: Path, tmp_path: Path, tail: list[str]
) -> None:
    """Through the console script: the head start begins before typer is imported and the
    verification takes it; a command line that turns out to be a usage error leaves no worker."""
    import subprocess

    db = f"sqlite:///{tmp_path}/v.db"
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE, "verify", str(checkpoint), "--db", db, *tail],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if tail:
        assert done.returncode == 2 and "No such option: --bogus" in done.stderr
        assert "head start taken" not in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert "integrity PASSED" in done.stdout
        assert "head start taken, begun before the command line: True" in done.stderr
    assert done.stderr.rstrip().endswith("no child left"), done.stderr


def test_a_head_start_that_cannot_begin_before_the_command_line_is_abandoned(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the command line loads no --timeout is in force: on storage that never answers
    (here the seal's read never returns) beginning is abandoned after WITHIN seconds, leaving no
    worker, and the verification begins it again under its own deadline."""
    import time

    import drill.cli.early as early

    def never_answers(*args: object, **kw: object) -> object:
        time.sleep(600)  # interrupted by the alarm; were it not, the suite's timeout fails the test
        raise AssertionError("the alarm did not end the wait")

    monkeypatch.setattr("drill.proc._claimed", False)  # restored after: this process is pytest's
    monkeypatch.setattr(early, "WITHIN", 0.2)
    monkeypatch.setattr(ahead, "read_manifest", never_answers)
    early.begin(["verify", str(checkpoint)])
    assert early.taken() is None
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_small_files_are_compared_with_the_seal_where_they_are_hashed(
    checkpoint: Path, forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file of one chunk comes back from the workers AS_SEALED, not as a digest to
    compare here; a file of several chunks with its digests. Every byte still counts as
    hashed."""
    from drill.integrity.hashing import AS_SEALED, FileHashes
    from drill.integrity.manifest import read_manifest
    from drill.storage import LocalStorage

    taken: list[dict] = []
    real = ahead.HeadStart.take

    def spied(self: ahead.HeadStart, listed: dict[str, int], sha256: frozenset[str]) -> dict:
        taken.append(got := real(self, listed, sha256))
        return got

    monkeypatch.setattr(ahead.HeadStart, "take", spied)
    outcome = verify_checkpoint(str(checkpoint))
    sealed, _ = read_manifest(LocalStorage(), str(checkpoint))
    assert sealed is not None and outcome.status == "passed"
    one_chunk = {f.path for f in sealed.files if len(f.chunks) == 1}
    assert {p for p, got in taken[0].items() if got is AS_SEALED} == one_chunk
    assert isinstance(taken[0][_big(checkpoint).name], FileHashes)
    assert outcome.bytes_hashed == sealed.total_bytes
