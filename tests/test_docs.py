"""The README, the docs/ pages and --help stay true to the code, and the site builds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from drill.cli.app import EXIT_CODES, app
from drill.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
CLI_REFERENCE = (DOCS / "cli.md").read_text()
README_LINES = 250


def _commands(group, prefix: str = "drill"):
    for name, cmd in group.commands.items():
        path = f"{prefix} {name}"
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path)
        else:
            yield path, cmd


def test_every_command_is_in_the_cli_reference_with_an_example() -> None:
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) >= 6
    for path, cmd in commands:
        assert f"## `{path}`" in CLI_REFERENCE, f"{path} has no section in docs/cli.md"
        assert "Example:" in (cmd.help or ""), f"{path} --help has no Example"
        for param in cmd.params:
            if getattr(param, "hidden", False):  # internal plumbing (the scheduler's child)
                continue
            for opt in getattr(param, "opts", []):
                if opt.startswith("--") and opt != "--help":
                    assert opt in CLI_REFERENCE, f"{path} {opt} is not in docs/cli.md"


def test_every_exit_code_is_documented() -> None:
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \|", CLI_REFERENCE, re.M), f"exit code {int(code)} missing from docs/cli.md"
        assert f"{int(code)} " in EXIT_CODES


def test_the_generated_pages_are_up_to_date() -> None:
    """docs/cli.md (from --help) and docs/findings.md (from drill.catalogue) are generated."""
    done = subprocess.run([sys.executable, str(DOCS / "generate.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_readme_is_short_and_its_links_resolve() -> None:
    lines = README.count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; the rest belongs in docs/"
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    """Every page in the nav, every link and anchor resolving: mkdocs --strict fails otherwise."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]


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


@pytest.mark.parametrize(
    "argv",
    [
        ["metrics", "--textfile", "{tmp}/drill.prom", "--no-list"],
        ["report", "--since", "30d", "-f", "html", "-o", "{tmp}/r.html", "--no-list"],
        ["history"],
        ["last-good", "--root", "/r"],
        ["audit", "verify"],
    ],
)
def test_reading_records_on_sqlite_imports_no_postgresql_dialect_nor_a_drills_machinery(
    tmp_path: Path, argv: list[str]
) -> None:
    """Commands that read the record load what they read with: on SQLite not PostgreSQL's
    dialect (50 ms of imports, for a column type), and not what runs a drill or a verification
    (its request, the replay, the integrity check) to read their outcomes back."""
    from drill.records.db import open_database

    db = f"sqlite:///{tmp_path / 'r.db'}"
    open_database(db).close()  # created and migrated here: the command only reads
    code = (
        "import atexit, sys; from drill.cli.app import main\n"
        "sys.argv = ['drill', *sys.argv[1:]]\n"
        "heavy = ('sqlalchemy.dialects.postgresql', 'drill.pipeline.request', 'drill.replay', 'drill.integrity.verify')\n"
        "atexit.register(lambda: print('sqlalchemy.orm' in sys.modules, [m for m in heavy if m in sys.modules]))\n"
        "main()"
    )
    args = [a.format(tmp=tmp_path) for a in argv]
    done = subprocess.run([sys.executable, "-c", code, *args, "--db", db], capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "True []", done.stderr


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_verify_of_a_sealed_checkpoint_imports_no_torch(pristine_run: Path, tmp_path: Path, flags: list[str]) -> None:
    """`drill verify` of a sealed checkpoint is a pure hashing job: no torch import, nor what
    only a restore needs (ctypes, to fault targets in) or an unsealed file (zipfile) — and,
    writing to a pipe, not rich either: its verdict is lines of plain text (and with --json
    one document)."""
    absent = "torch,ctypes,zipfile,rich"
    code = (
        "import atexit, sys; from drill.cli.app import main\n"
        "sys.argv = ['drill', 'verify', sys.argv[1], '--db', sys.argv[2], *sys.argv[4:]]\n"
        "atexit.register(lambda: print([m for m in sys.argv[3].split(',') if m in sys.modules]))\n"
        "main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(pristine_run / "step-20"), f"sqlite:///{tmp_path / 'v.db'}", absent, *flags],
        capture_output=True,
        text=True,
    )
    assert (done.stdout.strip().splitlines()[-1], done.returncode) == ("[]", 0)


def test_every_test_security_md_cites_exists() -> None:
    """docs/security.md backs each claim with tests: each one it names must be there."""
    import re

    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "security.md").read_text()
    cited = re.findall(r"`(test_\w+\.py)(?:::(test_\w+))?", text)
    assert len(cited) >= 20
    for file, name in cited:
        source = (root / "tests" / file).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), (
            f"docs/security.md cites {file}::{name}, which does not exist"
        )
