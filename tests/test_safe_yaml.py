"""YAML from files drill does not trust, read within bounds (drill.safe_yaml): a policy and a
trainer's snapshot metadata alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from drill import safe_yaml
from drill.verifier import verify_checkpoint

LAUGHS = "l0: &l0 [x]\n" + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9))
"""Nine anchors, each ten of the one before: 10^8 values written in 300 bytes."""


def test_aliases_that_share_a_value_load_and_aliases_that_multiply_it_are_refused() -> None:
    shared = "base: &b {lr: 0.1, steps: [1, 2, 3]}\nfirst: *b\nsecond: *b\n"
    assert safe_yaml.load(shared, max_depth=8) == {"base": {"lr": 0.1, "steps": [1, 2, 3]}} | {
        "first": {"lr": 0.1, "steps": [1, 2, 3]},
        "second": {"lr": 0.1, "steps": [1, 2, 3]},
    }
    with pytest.raises(safe_yaml.YamlRefused, match="once its aliases are expanded"):
        safe_yaml.load(LAUGHS, max_depth=8)
    with pytest.raises(safe_yaml.YamlRefused, match="more than 100 values"):
        safe_yaml.compose(shared * 0 + "a: [" + ", ".join(["1"] * 200) + "]\n", max_depth=8, max_nodes=100)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a: " + "[" * 50 + "]" * 50 + "\n", "nested more than 32 levels deep"),
        ("a: &a [*a]\n", "refers to the value that contains it"),
        ("a: [1, 2\n", "not valid YAML"),
        (b"a: \xc3\x28 garbage\n", "not valid YAML"),
        ("a: !!python/object/apply:os.system ['true']\n", "not plain data"),
    ],
)
def test_what_is_not_bounded_plain_yaml_is_refused_with_a_reason(text: str | bytes, why: str) -> None:
    with pytest.raises(safe_yaml.YamlRefused, match=why):
        safe_yaml.load(text, max_depth=32)


def test_a_snapshot_metadata_whose_aliases_multiply_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    """A torchsnapshot manifest of 20,000 entries, each an alias of one chunked tensor of 1,000
    chunks: 400 KB that would have every one of 20 million chunks located (34 s here)."""
    chunk = "{tensor: {type: Tensor, location: 0/x, serializer: torch_save, dtype: torch.float32, shape: [1]}, offsets: [0]}"
    entries = [f"  e0: &c {{type: ChunkedTensor, shape: [1000], chunks: [{', '.join([chunk] * 1000)}]}}"]
    entries += [f"  e{i}: *c" for i in range(1, 20_000)]
    (tmp_path / ".snapshot_metadata").write_text("version: 0.0.0\nworld_size: 1\nmanifest:\n" + "\n".join(entries))
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "x").write_bytes(b"x")
    result = verify_checkpoint(str(tmp_path)).result
    assert [(f.code, f.subject) for f in result.findings] == [("metadata-unreadable", ".snapshot_metadata")]
    assert "once its aliases are expanded" in result.findings[0].message
