"""Fail closed, by class: nothing from a checkpoint, a policy, a webhook or a database can hang
drill, fool it, or write through it (each class holds more instances than a test names)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import drill, invoke


# -- nothing drill writes can be redirected -------------------------------------------------------
def _verdict(target: Path, run: Path, db: str) -> None:
    from drill.launch.verdict import VerdictFile, write_verdict

    write_verdict(str(target), VerdictFile(1, "passed", 0, None))


def _metrics(target: Path, run: Path, db: str) -> None:
    res = invoke(CliRunner(), "metrics", "--textfile", str(target), "--no-list", "--db", db)
    assert res.exit_code == 0, res.stderr


def _report(target: Path, run: Path, db: str) -> None:
    res = invoke(CliRunner(), "report", "-o", str(target), "-f", "json", "--no-list", "--db", db)
    assert res.exit_code == 0, res.stderr


def _run_verdict(target: Path, run: Path, db: str) -> None:
    res = invoke(CliRunner(), "run", "--root", str(run), "--no-replay", "--verdict-file", str(target), "--db", db)
    assert res.exit_code == 0, res.stderr


WRITERS: dict[str, Callable[[Path, Path, str], None]] = {
    "verdict file": _verdict,
    "drill run --verdict-file": _run_verdict,
    "metrics textfile": _metrics,
    "report -o": _report,
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_link_planted_where_drill_writes_is_never_followed(
    name: str, tmp_path: Path, demo_run: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--verdict-file`` wrote ``PATH.tmp-PID`` with a plain open: another user's link planted
    there made drill clobber any file its user could write. Every file drill writes in a shared
    directory goes through one exclusive temporary file of a name no one can guess, renamed over
    the target: a link planted at the temporary name, or at the target itself, is never followed."""
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = shared / "out.prom"
    names = iter(["planted", "planted"])
    real = secrets.token_hex
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: next(names, None) or real(n))
    (shared / ".out.prom.planted.tmp").symlink_to(victim)  # the name it would have drawn first
    target.symlink_to(victim)  # and the target itself
    WRITERS[name](target, demo_run, sqlite_url)
    assert victim.read_text() == "precious"
    assert target.is_file() and not target.is_symlink() and target.stat().st_size > 0
    assert (shared / ".out.prom.planted.tmp").is_symlink()  # left as planted, not reused


# -- policy fields are data, never code or structure ----------------------------------------------
def _policy(tmp_path: Path, root: Path, allocation: dict, name: str = "nightly") -> Path:
    doc = {"name": name, "checkpoints": {"root": str(root)}, "allocation": allocation}
    (path := tmp_path / "p.yaml").write_text(json.dumps(doc))  # JSON is YAML: every string exactly as given
    return path


SLURM = {"launcher": "slurm"}
K8S = {"launcher": "k8s", "image": "registry.internal/drill:1", "volume_claim": "ckpt"}
BAD_FIELDS = [
    ("name", {**SLURM}, "nightly\n#SBATCH --uid=0"),
    ("partition", {**SLURM, "partition": "gpu\ntouch M"}, None),
    ("account", {**SLURM, "account": "acct;id"}, None),
    ("sbatch_args", {**SLURM, "sbatch_args": ["--qos=low\ntouch M"]}, None),
    ("log_dir", {**SLURM, "log_dir": "/tmp/x\ntouch M"}, None),
    ("rendezvous", {**SLURM, "rendezvous": "/shared/r\rx"}, None),
    ("namespace", {**K8S, "namespace": "training\nkind: Secret"}, None),
    ("namespace", {**K8S, "namespace": "Training"}, None),
    ("volume_claim", {**K8S, "volume_claim": "ckpt claim"}, None),
    ("s3_secret", {**K8S, "s3_secret": "s3\nx"}, None),
    ("database_secret", {**K8S, "database_secret": "DB_URL"}, None),
    ("image", {**K8S, "image": "img:1 --privileged"}, None),
    ("host_path", {**K8S, "volume_claim": None, "host_path": "relative/dir"}, None),
]


@pytest.mark.parametrize(
    ("field", "allocation", "name"), BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_FIELDS)]
)
def test_a_policy_field_that_reaches_a_script_or_manifest_is_held_to_its_grammar(
    tmp_path: Path, demo_run: Path, field: str, allocation: dict, name: str | None
) -> None:
    """``partition: "gpu\\ntouch M"`` became a line of the batch script and ran; a newline in a
    namespace was rendered into the manifest. Every field a script or manifest carries is
    checked to its grammar when the policy is loaded: exit 2, naming the field."""
    policy = _policy(tmp_path, demo_run, {k: v for k, v in allocation.items() if v is not None}, name or "nightly")
    res = invoke(CliRunner(), "policy", "check", str(policy))
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert field in res.stderr + res.stdout, res.stderr


def test_long_policy_names_render_kubernetes_objects_of_their_own(tmp_path: Path, demo_run: Path) -> None:
    """Names were cut to 40 characters: two long policy names rendered one ConfigMap and one
    CronJob, the second silently replacing the first's policy. A name that does not fit as it
    is carries a hash of the whole; one that fits is kept as it was."""
    from drill.launch.k8s import base_name
    from drill.policy import load_policy

    long = "nightly-restore-drill-of-the-llama-405b-run-"
    names = {
        base_name(load_policy(_policy(tmp_path, demo_run, K8S, n)))
        for n in (long + "a", long + "b", "my_policy", "my.policy", "My-Policy")
    }
    assert len(names) == 5 and all(len(n) <= 40 and n == n.lower() for n in names), names
    assert base_name(load_policy(_policy(tmp_path, demo_run, K8S, "nightly"))) == "drill-nightly"


def test_the_restricted_ready_claim_is_checked_on_the_rendered_pods(tmp_path: Path, demo_run: Path) -> None:
    """``host_path: /`` rendered the node's root into every pod, while the docs called the
    manifests restricted-ready. The rendered pod is checked against the restricted level; what
    falls short is said by ``policy check`` and ``submit``."""
    from drill.launch.k8s import manifests, pod_of
    from drill.launch.pss import restricted_violations
    from drill.policy import load_policy

    claim = load_policy(_policy(tmp_path, demo_run, K8S))
    assert all(restricted_violations(p) == [] for p in map(pod_of, manifests(claim)) if p is not None)
    root = _policy(tmp_path, demo_run, {**{k: v for k, v in K8S.items() if k != "volume_claim"}, "host_path": "/"})
    res = invoke(CliRunner(), "policy", "check", str(root))
    assert "not restricted-ready" in res.stdout + res.stderr and "whole root filesystem" in res.stdout + res.stderr
    res = invoke(CliRunner(), "submit", "--policy", str(root), "--dry-run")
    assert res.exit_code == 0 and "hostPath (/) is not allowed" in res.stderr, res.stderr


# -- bounded in time, always ----------------------------------------------------------------------
class _Trickle:
    """An HTTP server on 127.0.0.1 that answers one byte at a time, forever (until told to stop),
    or with a redirect to another scheme."""

    def __init__(self, answer: bytes, every: float) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks/secret"
        self.answer, self.every, self.stop = answer, every, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import itertools

        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                for byte in itertools.cycle(self.answer) if self.every else [self.answer]:
                    if self.stop.wait(self.every):
                        return
                    try:
                        conn.sendall(bytes([byte]) if self.every else self.answer)
                    except OSError:
                        break

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_a_webhook_that_trickles_its_answer_is_cut_off_at_its_budget() -> None:
    """A webhook answering one header byte at a time kept ``drill run --policy`` past every
    timeout (the timeout was per socket read): each attempt has a wall-clock budget in all."""
    import time

    from drill.alerts import post_webhook

    server = _Trickle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000, every=0.05)
    try:
        started = time.monotonic()
        delivery = post_webhook(server.url, {"text": "x"}, timeout=1.0, retries=1)
        assert not delivery.delivered and delivery.error == "timed out (over 1 s)", delivery
        assert time.monotonic() - started < 30  # without the budget: never
    finally:
        server.close()


def test_a_webhook_redirect_is_never_followed() -> None:
    """Webhook redirects were followed across schemes (to ``ftp://``): a 3xx is the answer."""
    from drill.alerts import post_webhook

    server = _Trickle(b"HTTP/1.1 302 Found\r\nLocation: ftp://127.0.0.1:9/x\r\nContent-Length: 0\r\n\r\n", every=0)
    try:
        delivery = post_webhook(server.url, {"text": "x"}, timeout=5.0, retries=1)
        assert not delivery.delivered and delivery.error == "HTTP 302: redirects are not followed", delivery
        assert "secret" not in repr(delivery)
    finally:
        server.close()


# -- every parser of checkpoint-controlled bytes is bounded ---------------------------------------
def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("levels", [300, 100_000])
@pytest.mark.parametrize("where", ["drill-manifest.json", "run.json", "safetensors header"])
def test_json_nested_past_any_walk_is_damage_never_an_internal_error(
    demo_run: Path, sqlite_url: str, tmp_path: Path, where: str, levels: int
) -> None:
    """A safetensors header nested 100,000 deep was exit 70 in ``verify``; nesting just under
    the parser's limit reached walks that could not follow it. Every JSON a checkpoint or its
    run holds is parsed within bounds: damage, named, never a traceback."""
    import struct

    ckpt = sorted(demo_run.glob("step-*"), key=lambda p: int(p.name[5:]))[-1]
    if where == "safetensors header":
        header = ('{"__metadata__": {"x": "' + "y" + '"}, "deep": ' + _deep(levels) + "}").encode()
        (target := tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
        res = invoke(CliRunner(), "verify", str(target))
    elif where == "drill-manifest.json":
        (ckpt / "drill-manifest.json").write_text('{"files": ' + _deep(levels) + "}")
        res = invoke(CliRunner(), "verify", str(ckpt))
    else:
        (demo_run / "run.json").write_text('{"replay": ' + _deep(levels) + "}")
        res = invoke(CliRunner(), "run", "--root", str(demo_run), "--db", sqlite_url)
    assert res.exit_code in ((0, 1, 5) if where == "run.json" else (1,)), (
        res.exit_code,
        res.stdout[-2000:],
        res.stderr,
    )
    assert "Traceback" not in res.stdout + res.stderr and "internal error" not in res.stderr, res.stderr


class _FreezableProxy:
    """A TCP proxy on 127.0.0.1 to the test PostgreSQL that, once frozen, keeps every
    connection open and moves no byte more (a link that stops answering, not one that drops)."""

    def __init__(self, port: int = 5432) -> None:
        import socket
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen, self.closed = threading.Event(), threading.Event()
        self.upstream = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst) -> None:  # type: ignore[no-untyped-def]
        while not self.closed.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            while self.frozen.is_set() and not self.closed.is_set():
                self.closed.wait(0.05)  # holds the bytes: the link is open and silent
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.mark.postgres
def test_a_postgresql_link_that_stops_answering_mid_drill_spools_the_verdict_and_ends_it(
    demo_run: Path, postgres_url: str, private_spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL link that stopped moving bytes (connection kept open) hung ``drill run``
    forever and lost its verdict: only a connect timeout was set. Every transaction has a
    wall-clock bound; past it the connection is cut, the drill goes on without the database,
    and its verdict is spooled — delivered once the database answers again."""
    from drill.records.db import upgrade
    from drill.restore import NullProgress

    upgrade(postgres_url)
    proxy = _FreezableProxy()
    url = postgres_url.replace("@127.0.0.1:5432/", f"@127.0.0.1:{proxy.port}/").replace(
        "//127.0.0.1:5432/", f"//127.0.0.1:{proxy.port}/"
    )
    assert str(proxy.port) in url, url
    monkeypatch.setenv("DRILL_DATABASE_TIMEOUT", "2")

    class FreezeAtChecks(NullProgress):
        def phase(self, name: str, total_bytes: int | None = None) -> None:
            if name.startswith("checks"):
                proxy.frozen.set()

    import time

    from drill.records.db import open_database
    from drill.records.recorder import DatabaseRecorder

    try:
        started = time.monotonic()
        outcome = drill(demo_run, url, progress=FreezeAtChecks())
        assert proxy.frozen.is_set() and time.monotonic() - started < 240  # unbounded, it never returned
        assert outcome.status == "passed" and outcome.record_problem is not None, outcome.record_problem
        assert "kept in" in outcome.record_problem, outcome.record_problem  # the verdict spooled
        # (why the last write failed: the transaction cut, or a new connection's own timeout)
        assert any(why in outcome.record_problem for why in ("stopped answering", "timeout expired")), (
            outcome.record_problem
        )
        assert len(list(private_spool.glob("*.json"))) == 1
        proxy.frozen.clear()  # the link answers again: the verdict is delivered, once
        db = open_database(url)
        try:
            assert DatabaseRecorder(db).flush().delivered == 1
        finally:
            db.close()
    finally:
        proxy.close()


# -- names from storage are data: one line, escaped -------------------------------------------------
HOSTILE_ROOT = "run\nstep-999 passed\x1b[32m\r\u202e"


def test_a_name_from_storage_is_shown_on_one_line_whatever_it_holds(
    pristine_run: Path, tmp_path: Path, sqlite_url: str
) -> None:
    """ESC, CR and U+202E from run roots and checkpoint names reached the terminal raw, and a
    newline in a root forged a "step-999 passed" line in ``runs``, ``last-good``, ``history``.
    Every string drill shows a person is one line, its controls escaped."""
    import shutil

    root = tmp_path / HOSTILE_ROOT
    shutil.copytree(pristine_run, root)
    assert drill(root, sqlite_url).status == "passed"
    for argv in (
        ["history"],
        ["show", "1"],
        ["runs"],
        ["runs", str(root), "--no-list"],
        ["last-good", "--root", str(root)],
        ["report", "-f", "md", "--no-list"],
    ):
        res = invoke(CliRunner(), *argv, "--db", sqlite_url)
        assert res.exit_code == 0, (argv, res.stderr)
        shown = (
            res.stderr if argv[0] == "last-good" else res.stdout + res.stderr
        )  # last-good's stdout is the path: data
        assert not any(c in shown for c in "\x1b\r\u202e"), (argv, shown)
        assert not any(line.lstrip().startswith("step-999 passed") for line in shown.splitlines()), (argv, shown)


@pytest.mark.parametrize(
    "argv",
    [
        ["burst", "--readers", "1,,2"],
        ["burst", "--readers", "1,2", "--readers", "8"],
        ["run", "--no-replay", "--checkpoint", "step:10", "--checkpoint", "step:20"],
        ["history", "--limit", "5", "--limit=6"],
        ["runs", "{file}"],
    ],
    ids=["empty-item", "repeated-readers", "repeated-checkpoint", "repeated-limit", "runs-of-a-file"],
)
def test_an_ambiguous_or_impossible_command_line_is_a_usage_error(
    demo_run: Path, sqlite_url: str, tmp_path: Path, argv: list[str]
) -> None:
    """``--readers 1,,2`` was accepted, a repeated ``--readers`` silently kept the last, and
    ``drill runs FILE`` exited 0: each is exit 2, one line, before anything is read."""
    (file := tmp_path / "a-file").write_text("x")
    argv = [a.replace("{file}", str(file)) for a in argv]
    if argv[0] in ("burst", "run"):
        argv += ["--root", str(demo_run)]
    res = invoke(CliRunner(), *argv, "--db", sqlite_url)
    assert res.exit_code == 2 and res.stderr.startswith("drill: error: "), (res.exit_code, res.stderr)
    assert len(res.stderr.strip().splitlines()) <= 2 and "Traceback" not in res.stderr


# -- damage is a failure, never an error ------------------------------------------------------------
@pytest.mark.parametrize("damage", ["shards swapped", "another save's index"])
@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "unsealed"])
def test_files_that_are_not_the_ones_the_index_names_fail_the_drill(
    demo_run: Path, sqlite_url: str, tmp_path: Path, damage: str, sealed: bool
) -> None:
    """Two DCP shards swapped, or another save's ``.metadata`` copied in, ended ``error`` (exit
    5) with a ``struct.error`` from the entry decoder: bytes that do not decode as the entry the
    index names are that entry's finding, and the drill fails (exit 1)."""
    import shutil

    from tests.test_formats import rewrite_dcp

    ckpt = sorted(demo_run.glob("step-*"), key=lambda p: int(p.name[5:]))[-1]
    if damage == "shards swapped":
        a, b = ckpt / "__0_0.distcp", ckpt / "__0_1.distcp"
        a.rename(tmp_path / "a")
        b.rename(a)
        (tmp_path / "a").rename(b)
    else:
        other = tmp_path / "other" / ckpt.name
        shutil.copytree(ckpt, other)
        rewrite_dcp(other, lambda s: [s.pop(k) for k in [k for k in s if k.startswith("model.blocks.0.")]])
        shutil.copy(other / ".metadata", ckpt / ".metadata")
    if not sealed:
        (ckpt / "drill-manifest.json").unlink()
    outcome = drill(demo_run, sqlite_url)
    assert (outcome.status, int(outcome.exit_code)) == ("failed", 1), (outcome.status, outcome.message)


# -- a save that says sealed is on disk ------------------------------------------------------------
def test_a_second_save_into_a_step_being_saved_fails_and_seals_nothing(tmp_path: Path) -> None:
    """Two processes calling ``drill.sdk.save`` into one step at once both returned success and
    recorded a sealed save, while the step held one state. The coordinator takes the step
    directory before any rank writes; a second save into it meanwhile fails, clearly, having
    written nothing — and once the first is done, the step is free again."""
    import torch

    from drill.integrity.sealing import take_step
    from drill.sdk import SaveBusy, save
    from drill.verifier import verify_checkpoint

    step = tmp_path / "run" / "step-10"
    step.mkdir(parents=True)
    held = take_step(step)  # the other save, mid-write
    assert held is not None
    try:
        with pytest.raises(SaveBusy, match="another save is writing"):
            save({"w": torch.ones(4)}, checkpoint_id=step, no_dist=True)
        assert not (step / "drill-manifest.json").exists() and not (step / ".metadata").exists()
    finally:
        import os

        os.close(held)
    save({"w": torch.ones(4)}, checkpoint_id=step, no_dist=True)  # the step is free again
    assert verify_checkpoint(str(step)).status == "passed"


def test_drill_seal_from_python_is_the_guarded_seal(demo_run: Path) -> None:
    """``drill.seal(run_root)`` sealed a whole run root that ``drill seal`` refuses: the Python
    name is the guarded seal the command uses."""
    import drill as api
    from drill.errors import UsageError

    with pytest.raises(UsageError, match="checkpoint"):
        api.seal(str(demo_run))
    assert not (demo_run / "drill-manifest.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["seal", "s3://ckpt/run/step-10"],
        ["last-good", "--root", "s3://ckpt/run"],
        ["burst", "--root", "s3://ckpt/run", "--readers", "1"],
        ["verify", "s3://ckpt/run/step-10"],
    ],
    ids=["seal", "last-good", "burst", "verify"],
)
def test_every_command_that_reaches_storage_ends_at_its_timeout_on_a_silent_endpoint(
    argv: list[str], sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``seal``, ``last-good`` and ``burst`` on a silent S3 endpoint had no ``--timeout``: every
    command that reaches storage has one, and ends at it as an error (exit 5), one line."""
    import socket
    import time

    silent = socket.create_server(("127.0.0.1", 0), backlog=64)  # accepts connections, never answers
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "drill-test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "drill-test-secret")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("DRILL_S3_ADDRESSING_STYLE", "path")
        started = time.monotonic()
        db = [] if argv[0] == "seal" else ["--db", sqlite_url]
        res = invoke(CliRunner(), *argv, "--timeout", "3", *db)
        assert res.exit_code == 5 and "timeout" in res.stderr, (res.exit_code, res.stderr)
        assert time.monotonic() - started < 60
    finally:
        silent.close()


# -- a structural proof is as strict as the writer's own loader -----------------------------------
def test_an_index_claiming_chunks_its_files_do_not_hold_fails_verify_as_it_fails_run(demo_run: Path) -> None:
    """A ``.metadata`` claiming chunks with no storage entry (5 million of them) made ``verify``
    exit 0 while ``run`` refused it: the structural proof asks what the loader asks."""
    import pickle

    import torch
    import torch.distributed.checkpoint.metadata as md

    from drill.safe_pickle import restricted_loads
    from drill.verifier import verify_checkpoint

    ckpt = sorted(demo_run.glob("step-*"), key=lambda p: int(p.name[5:]))[-1]
    (ckpt / "drill-manifest.json").unlink()
    meta = restricted_loads((ckpt / ".metadata").read_bytes())
    fqn, tensor = next((k, v) for k, v in meta.state_dict_metadata.items() if hasattr(v, "chunks") and len(v.size) == 2)
    rows, cols = tensor.size
    tensor.chunks.extend(  # chunks no storage entry holds
        md.ChunkStorageMetadata(offsets=torch.Size([r, 0]), sizes=torch.Size([1, cols])) for r in range(1, rows)
    )
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    outcome = verify_checkpoint(str(ckpt))
    assert outcome.status == "failed" and "metadata-implausible" in [f.code for f in outcome.result.errors], (
        outcome.result.findings
    )
