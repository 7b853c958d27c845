"""The seal as drill writes it: the canonical bytes its digests cover, the digests last.

A reader checks the digest against those bytes as read and parses only the bytes it checked;
a seal in any other layout is parsed whole and its canonical re-encoding checked, as always.
Every edit of a seal must get the same verdict either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xxhash

from drill.integrity import manifest as manifest_module
from drill.integrity.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ManifestInvalid,
    canonical,
    parse_manifest,
    self_digest,
)
from drill.verifier import verify_checkpoint

KEY = b"k" * 32


def _manifest() -> Manifest:
    files = [
        FileEntry(".metadata", 100, "aa" * 16, ("ab" * 16,)),
        FileEntry("__0_0.distcp", 20, "cc" * 16, ("cd" * 16,)),
        FileEntry("__1_0.distcp", 40, "ee" * 16, ("ef" * 16,)),
    ]
    return Manifest(step=7, chunk_size=128, files=files, frameworks={"drill": "x"}, created_at="2026-12-06T00:00:00")


def _parsed_the_old_way(data: bytes, monkeypatch: pytest.MonkeyPatch) -> Manifest | str:
    """What the parse says with the layout's short cut taken away: the whole parsed, its
    canonical re-encoding checked."""
    with monkeypatch.context() as m:
        m.setattr(manifest_module, "_as_written", lambda data: (None, None))
        return _parsed(data)


def _parsed(data: bytes) -> Manifest | str:
    try:
        return parse_manifest(data)
    except ManifestInvalid as exc:
        return exc.code


def test_drill_writes_the_canonical_body_then_its_digests() -> None:
    data = _manifest().to_json()
    assert data.count(b"\n") == 1 and data.endswith(b'"}\n')
    doc = json.loads(data)
    signed = canonical(doc)
    assert data == signed[:-1] + f',"manifest_xxh3_128":"{doc["manifest_xxh3_128"]}"}}\n'.encode()
    assert doc["manifest_xxh3_128"] == self_digest(doc) == xxhash.xxh3_128_hexdigest(signed)


def test_a_seal_as_written_is_read_without_encoding_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _manifest().to_json()

    def no_encoding(*args: object, **kw: object) -> bytes:
        raise AssertionError("re-encoded a seal laid out as drill writes it")

    monkeypatch.setattr(manifest_module, "canonical", no_encoding)
    parsed = parse_manifest(data)
    assert parsed.files == _manifest().files and parsed.step == 7
    assert parsed.signed == data[: data.rindex(b',"manifest_xxh3_128"')] + b"}"


def test_an_indented_seal_of_an_older_drill_still_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    older = (json.dumps(json.loads(_manifest().to_json()), indent=1) + "\n").encode()
    parsed = parse_manifest(older)
    assert parsed.files == _manifest().files
    assert parsed.signed == parse_manifest(_manifest().to_json()).signed


def _flip(at: int):
    def edit(data: bytes) -> bytes:
        i = at % len(data)
        return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]

    edit.__name__ = f"flip_byte_{at}"
    return edit


def _replace(old: bytes, new: bytes, name: str):
    def edit(data: bytes) -> bytes:
        assert old in data
        return data.replace(old, new, 1)

    edit.__name__ = name
    return edit


def _digest_inside_the_body(data: bytes) -> bytes:
    """A body that carries a digest member of its own, the real one appended after it."""
    doc = json.loads(data)
    body = canonical(doc)
    inner = body[:-1] + b',"manifest_xxh3_128":"' + b"0" * 32 + b'"}'
    return inner[:-1] + f',"manifest_xxh3_128":"{xxhash.xxh3_128_hexdigest(inner)}"}}\n'.encode()


EDITS = [
    lambda data: data,
    lambda data: data.rstrip(b"\n"),
    lambda data: data + b"  \n",
    lambda data: data[:-3] + b'" }\n',
    lambda data: data[:-2],
    lambda data: data[:-40],
    lambda data: data.upper(),
    _flip(10),
    _flip(60),
    _flip(150),
    _flip(-5),
    _flip(-30),
    _replace(b'"size":20', b'"size":21', "grown_size"),
    _replace(b'"step":7', b'"step":8', "other_step"),
    _replace(b'"__0_0.distcp"', b'"../0_0.distcp"', "path_out"),
    _replace(b'"format":"drill-manifest"', b'"format":"drill-manifesto"', "other_format"),
    _replace(b',"manifest_xxh3_128"', b',"manifest_xxh3_128 "', "digest_renamed"),
    _digest_inside_the_body,
    lambda data: data[: data.rindex(b",")] + b"}\n",
    lambda data: b"[" + data + b"]",
]


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("edit", EDITS, ids=lambda e: e.__name__ if e.__name__ != "<lambda>" else None)
def test_every_edit_of_a_seal_gets_the_verdict_the_whole_parse_gives(
    edit, keyed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = edit(_manifest().to_json(KEY if keyed else None))
    fast, whole = _parsed(data), _parsed_the_old_way(data, monkeypatch)
    if isinstance(whole, str):
        assert fast == whole
        return
    assert isinstance(fast, Manifest)
    assert (fast.files, fast.step, fast.chunk_size, fast.signed, fast.hmac_sha256, fast.key_id) == (
        whole.files,
        whole.step,
        whole.chunk_size,
        whole.signed,
        whole.hmac_sha256,
        whole.key_id,
    )
    if keyed:
        assert fast.authenticate(KEY) == whole.authenticate(KEY)


def test_the_digest_covers_the_bytes_as_written_and_only_they_are_read() -> None:
    """A body laid out otherwise (keys unsorted, spaces) whose digest is that of its own bytes:
    what is read is those bytes, never what stands outside them."""
    body = b'{"version": 1, "format": "drill-manifest", "chunk_size": 128, "files": []}'
    data = body[:-1] + f',"manifest_xxh3_128":"{xxhash.xxh3_128_hexdigest(body)}"}}'.encode()
    parsed = parse_manifest(data)
    assert parsed.signed == body and parsed.files == []


def test_a_keyed_seal_edited_without_the_key_fails_to_authenticate() -> None:
    data = _manifest().to_json(KEY)
    assert parse_manifest(data).authenticate(KEY) is None
    forged_body = canonical(json.loads(data)).replace(b'"size":20', b'"size":21')
    tail = data[data.index(b',"manifest_hmac_sha256"') :]
    forged = forged_body[:-1] + tail.replace(
        tail[tail.index(b'"manifest_xxh3_128":"') + 21 :][:32], xxhash.xxh3_128_hexdigest(forged_body).encode()
    )
    parsed = parse_manifest(forged)  # its plain digest matches: only the key can tell
    assert parsed.files[1].size == 21
    assert "HMAC does not match" in (parsed.authenticate(KEY) or "")


def test_a_sealed_checkpoint_verifies_from_the_seal_as_written(tmp_path: Path) -> None:
    import drill.sdk

    torch = pytest.importorskip("torch")
    ckpt = tmp_path / "step-1"
    drill.sdk.save({"w": torch.arange(64.0)}, str(ckpt), no_dist=True, sync_files=False)
    seal = (ckpt / MANIFEST_NAME).read_bytes()
    assert seal.count(b"\n") == 1
    assert verify_checkpoint(str(ckpt)).exit_code == 0
    (ckpt / MANIFEST_NAME).write_bytes(seal.replace(b'"size":', b'"size":1', 1))
    result = verify_checkpoint(str(ckpt)).result
    assert [f.code for f in result.findings] == ["manifest-digest-mismatch"]


def test_the_parsed_files_are_freed_before_a_verifier_is_told_them() -> None:
    """A verifier forks its hashing workers when it is told the seal's files
    (:mod:`drill.integrity.ahead`): the JSON parsed for each file is freed by then, not after
    the fork — every page the parent frees while a worker shares it is copied first."""
    import gc

    def parsed_files_alive() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is dict and "xxh3_128" in o and "chunks" in o)

    alive: list[int] = []
    gc.collect()  # earlier tests' garbage gone, and no collection in between to free more of it
    gc.disable()
    try:
        before = parsed_files_alive()
        parsed = parse_manifest(_manifest().to_json(), lambda files, chunk: alive.append(parsed_files_alive()))
        assert alive == [before] and parsed.files == _manifest().files
        # A seal laid out otherwise keeps its parse for the re-encoding its digest is checked on.
        older = (json.dumps(json.loads(_manifest().to_json()), indent=1) + "\n").encode()
        assert parse_manifest(older, lambda files, chunk: alive.append(parsed_files_alive())).files == parsed.files
        assert alive[1] == before + len(parsed.files)
    finally:
        gc.enable()
