"""Finding codes are a wire format: each one drill emits is in the catalogue (drill.catalogue),
each catalogue entry is emitted somewhere, and the generated page says what the catalogue says.

The static half is here: every code literal in drill's source at a place that makes a finding
or a failure. The dynamic half is in conftest.py: every finding any test makes, with the
severity it was made at, must be in the catalogue, or the session fails.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from drill.catalogue import CODES, areas, describe
from drill.findings import Severity

DRILL = Path(__file__).resolve().parent.parent / "drill"
CODE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9_]+)+$")


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in DRILL.rglob("*.py") if p.name != "catalogue.py"}


def _code_takers(trees: dict[Path, ast.Module]) -> set[str]:
    """Functions whose first parameter is ``code``, and classes whose constructor's is."""
    out = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.args.args and node.args.args[0].arg == "code":
                out.add(node.name)
            if isinstance(node, ast.ClassDef):
                init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
                if init is not None and len(init.args.args) > 1 and init.args.args[1].arg == "code":
                    out.add(node.name)
    return out


def _literals(node: ast.AST | None) -> Iterator[str]:
    for n in ast.walk(node) if node is not None else ():
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and CODE.match(n.value):
            yield n.value


def _emitted() -> dict[str, str]:
    """Code → a file that emits it, from every place a code is given: ``code=``, a function or
    class taking ``code`` first, ``ItemFailure``'s fourth argument, a name ending in ``code``."""
    trees = _trees()
    takers = _code_takers(trees)
    out: dict[str, str] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            given: list[ast.AST | None] = []
            if isinstance(node, ast.keyword) and node.arg in ("code", "metadata_code"):
                given.append(node.value)
            elif isinstance(node, ast.Call):
                name = ast.unparse(node.func).rsplit(".", 1)[-1]
                given += [node.args[0]] if name in takers and node.args else []
                given += [node.args[3]] if name == "ItemFailure" and len(node.args) > 3 else []
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names = target.elts if isinstance(target, ast.Tuple) else [target]
                    values = (
                        node.value.elts
                        if isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(names)
                        else [node.value] * len(names)
                    )
                    given += [v for t, v in zip(names, values, strict=True) if ast.unparse(t).lower().endswith("code")]
                    # a table of codes (``_CODES = {"missing": ("file-missing", ...)}``)
                    given += [node.value] if ast.unparse(target).upper().endswith("CODES") else []
            for value in given:
                for code in _literals(value):
                    out.setdefault(code, str(path.relative_to(DRILL.parent)))
    return out


def test_every_code_drill_emits_is_in_the_catalogue() -> None:
    emitted = _emitted()
    assert len(emitted) >= 60, "the scan found too few codes: it no longer sees where findings are made"
    missing = {code: where for code, where in emitted.items() if describe(code) is None}
    assert not missing, f"codes emitted but not in drill.catalogue: {missing}"


def test_every_catalogue_code_is_emitted_somewhere() -> None:
    source = "\n".join(p.read_text() for p in DRILL.rglob("*.py") if p.name != "catalogue.py")
    emitted = set(_emitted())
    # replay-diverged-<what> is built from the divergence's name (drill.replay.compare)
    built = {f"replay-diverged-{what}" for what in re.findall(r'Divergence\([^,]+, "(\w+)"', source)}
    stale = [code for code in CODES if code not in emitted | built and f'"{code}"' not in source]
    assert not stale, f"catalogue entries nothing emits: {stale}"


def test_each_entry_is_complete() -> None:
    for entry in CODES.values():
        assert CODE.match(entry.code), entry.code
        assert entry.severities and all(isinstance(s, Severity) for s in entry.severities), entry.code
        assert entry.meaning.endswith(".") and len(entry.meaning) > 20, entry.code
        assert entry.hint and "TODO" not in entry.hint, entry.code
    grouped = [c.code for _, codes in areas() for c in codes]
    assert sorted(grouped) == sorted(CODES), "a code whose area has no heading"


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_finding_outside_the_catalogue_fails_the_session_in_one_process_or_many(tmp_path: Path, workers: str) -> None:
    """The dynamic half (conftest.py) holds under pytest-xdist too: a worker's own exit status
    fails nothing, so each hands what it saw to the controller, which fails the run."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    for n in (1, 2):  # two modules: with two workers, one each
        (tmp_path / f"test_made_{n}.py").write_text(
            "from drill.findings import Finding, Severity\n\n\n"
            f"def test_made() -> None:\n"
            f"    Finding(check='c', code='not-in-the-catalogue-{n}', severity=Severity.ERROR, subject=None, message='m')\n"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DRILL.parent), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, "--dist", "loadfile", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert "2 passed" in out and res.returncode == pytest.ExitCode.TESTS_FAILED, out
    for n in (1, 2):
        assert f"not-in-the-catalogue-{n} is not in drill.catalogue.CODES" in out, out
