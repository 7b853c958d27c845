"""The layout shows the architecture: no import cycles between drill's packages nor between
the modules inside one, no private name imported from another module, functions that fit on
a screen, and no large file committed."""

from __future__ import annotations

import ast
import subprocess
from collections import defaultdict
from pathlib import Path

DRILL = Path(__file__).resolve().parent.parent / "drill"
MAX_LINES = 60
MAX_FILE_BYTES = 512 << 10
"""A committed file larger than this is a mistake (a wheel, a checkpoint, a database)."""


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "drill" else None


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in DRILL.rglob("*.py"):
        rel = ".".join(path.relative_to(DRILL.parent).with_suffix("").parts).replace(".__init__", "")
        src = _unit(rel) or "__init__"
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            edges[src] |= {u for n in names if (u := _unit(n)) and u != src}
    return edges


def _cycle_through(edges: dict[str, set[str]], start: str) -> list[str] | None:
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in edges.get(node, ()):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_no_import_cycles_between_packages() -> None:
    edges = _graph()
    cycles = [c for unit in sorted(edges) if (c := _cycle_through(edges, unit))]
    assert not cycles, f"import cycle: {' → '.join(cycles[0])}"


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of a function's code: from its first statement after the docstring to its end
    (a command's signature of one option per line, as the formatter writes it, is not code)."""
    body = (
        node.body[1:]
        if len(node.body) > 1 and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
        else node.body
    )
    return (node.end_lineno or node.lineno) - body[0].lineno + 1


def test_functions_fit_on_a_screen() -> None:
    long = []
    for path in DRILL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (n := _body_lines(node)) > MAX_LINES:
                long.append(f"{path.relative_to(DRILL.parent)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "longer than a screen: " + ", ".join(long)


def test_the_pipeline_reads_top_to_bottom_in_one_screen() -> None:
    source = (DRILL / "pipeline" / "__init__.py").read_text()
    run = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "run_drill")
    body = source.splitlines()[run.lineno - 1 : run.end_lineno]
    stages = [line.split("(")[1].split(",")[0].strip('"') for line in body if "drill.stage(" in line]
    assert stages == ["discover", "plan", "restore", "checks", "replay"]


def _module(path: Path) -> str:
    return ".".join(path.relative_to(DRILL.parent).with_suffix("").parts).removesuffix(".__init__")


def _module_imports(modules: set[str], tree: ast.AST) -> set[str]:
    """Every drill module ``tree`` imports — inside functions too, where a cycle hides — except
    under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import mod`` imports mod; ``from mod import name`` imports mod
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            ]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def _module_cycle() -> list[str] | None:
    paths = {_module(p): p for p in DRILL.rglob("*.py")}
    edges = {m: _module_imports(set(paths), ast.parse(p.read_text())) - {m} for m, p in paths.items()}
    for start in sorted(edges):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in edges[node]:
                # a package's __init__ re-exporting its own modules is not a design cycle
                if nxt == start and not all(m == start or m.startswith(start + ".") for m in path):
                    return [*path, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycles_between_modules() -> None:
    """A cycle hidden by an import inside a function is still a cycle: the two modules are one."""
    cycle = _module_cycle()
    assert cycle is None, f"import cycle between modules: {' → '.join(cycle or [])}"


def test_no_private_name_is_imported_from_another_module() -> None:
    private = []
    for path in DRILL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("drill"):
                private += [
                    f"{_module(path)} imports {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not private, "; ".join(private)


def test_no_large_file_is_committed() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=DRILL.parent, capture_output=True, check=True
    ).stdout.decode()
    large = [
        name
        for name in listed.split("\0")
        if name and (DRILL.parent / name).is_file() and (DRILL.parent / name).stat().st_size > MAX_FILE_BYTES
    ]
    assert not large, (
        f"larger than {MAX_FILE_BYTES >> 10} KiB: {', '.join(large)} (keep wheels, checkpoints and databases out of git)"
    )
