"""The README and --help stay true to the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import typer

from drill.cli.app import EXIT_CODES, app
from drill.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _commands(group, prefix: str = "drill"):  # type: ignore[no-untyped-def]
    for name, cmd in group.commands.items():
        path = f"{prefix} {name}"
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path)
        else:
            yield path, cmd


def test_every_command_is_documented_in_the_readme() -> None:
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) >= 6
    for path, cmd in commands:
        assert f"### `{path}" in README, f"{path} has no section in README.md"
        assert "Example:" in (cmd.help or ""), f"{path} --help has no Example"
        for param in cmd.params:
            if getattr(param, "hidden", False):  # internal plumbing (the scheduler's child)
                continue
            for opt in getattr(param, "opts", []):
                if opt.startswith("--") and opt != "--help":
                    assert opt in README, f"{path} {opt} is not in README.md"


def test_every_exit_code_is_documented() -> None:
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \|", README, re.M), f"exit code {int(code)} missing from README table"
        assert f"{int(code)} " in EXIT_CODES


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    match = re.search(r"<!-- test-command -->\s*```(?:sh|bash)?\n(.+?)\n```", README, re.S)
    assert match, "README must mark its test command with <!-- test-command -->"
    command = match.group(1).strip()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_the_cli_imports_no_heavy_modules() -> None:
    """`drill --help` must stay quick: torch, SQLAlchemy and boto3 load only where used."""
    code = "import sys, drill.cli.app; print(','.join(m for m in ('torch','boto3','sqlalchemy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_sdk_imports_no_database_or_cli() -> None:
    code = (
        "import sys, drill.sdk; "
        "print(','.join(m for m in ('sqlalchemy','boto3','typer','rich','drill.cli') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_verify_of_a_sealed_checkpoint_imports_no_torch(pristine_run: Path, tmp_path: Path) -> None:
    """`drill verify` of a sealed checkpoint is a pure hashing job: no torch import."""
    code = (
        "import atexit, sys; from drill.cli.app import main; sys.argv = ['drill', 'verify', sys.argv[1], '--db', sys.argv[2]]\n"
        "atexit.register(lambda: print('torch' in sys.modules))\n"
        "main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(pristine_run / "step-20"), f"sqlite:///{tmp_path / 'v.db'}"], capture_output=True, text=True
    )
    assert (done.stdout.strip().splitlines()[-1], done.returncode) == ("False", 0)


def test_every_test_security_md_cites_exists() -> None:
    """SECURITY.md backs each claim with tests: each one it names must be there."""
    import re

    root = Path(__file__).resolve().parent.parent
    text = (root / "SECURITY.md").read_text()
    cited = re.findall(r"`(test_\w+\.py)(?:::(test_\w+))?", text)
    assert len(cited) >= 20
    for file, name in cited:
        source = (root / "tests" / file).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), f"SECURITY.md cites {file}::{name}, which does not exist"
