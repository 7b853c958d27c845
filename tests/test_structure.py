"""The layout shows the architecture: no import cycles between drill's packages, and
functions that fit on a screen."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

DRILL = Path(__file__).resolve().parent.parent / "drill"
MAX_LINES = 60


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


def test_functions_fit_on_a_screen() -> None:
    long = []
    for path in DRILL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_LINES:  # type: ignore[operator]
                long.append(f"{path.relative_to(DRILL.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")  # type: ignore[operator]
    assert not long, "longer than a screen: " + ", ".join(long)


def test_the_pipeline_reads_top_to_bottom_in_one_screen() -> None:
    source = (DRILL / "pipeline" / "__init__.py").read_text()
    run = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "run_drill")
    body = source.splitlines()[run.lineno - 1 : run.end_lineno]
    stages = [line.split("(")[1].split(",")[0].strip('"') for line in body if "drill.stage(" in line]
    assert stages == ["discover", "plan", "restore", "checks", "replay"]
