"""The house rules as tests, so that the README's test command (and so CI) enforces them:
ruff (with the complexity ceiling), mypy, the import-linter layers of docs/architecture.md, no
import cycle, and the size limits (modules, functions) that keep the code readable.

Each runs the tool on the working tree as a developer would (``ruff check``, ``mypy``,
``lint-imports``) and shows its output on failure.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "statectl"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _assert_clean(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, f"{' '.join(out.args)} failed:\n{out.stdout}\n{out.stderr}"


def test_ruff_lint_and_format() -> None:
    _assert_clean(
        _run(sys.executable, "-m", "ruff", "check", "statectl", "tests", "bench", "fixtures")
    )
    _assert_clean(_run(sys.executable, "-m", "ruff", "format", "--check", "statectl", "tests"))


def test_mypy_reports_no_error() -> None:
    _assert_clean(_run(sys.executable, "-m", "mypy"))  # files and options: pyproject.toml


def test_imports_follow_the_layers_of_docs_architecture() -> None:
    # The console script of this interpreter's environment (a venv's, or the system's).
    beside = Path(sys.executable).parent / "lint-imports"
    out = _run(str(beside) if beside.exists() else "lint-imports")
    _assert_clean(out)
    assert "1 kept, 0 broken" in out.stdout


def test_no_import_cycle() -> None:
    """Function-level imports included (grimp reads every import statement)."""
    grimp = pytest.importorskip("grimp")
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("statectl")
    cycles = [
        (m, i)
        for m in sorted(graph.modules)
        for i in graph.find_modules_directly_imported_by(m)
        if graph.chain_exists(importer=i, imported=m)
    ]
    assert graph.modules, "no module found"
    assert cycles == []


def _modules() -> list[Path]:
    found = sorted(LIBRARY.rglob("*.py"))
    assert len(found) > 50
    return found


def test_no_module_over_the_limit() -> None:
    big = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}


def test_no_function_over_the_limit() -> None:
    long = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert long == []


def test_statectl_imports_are_at_module_level_outside_the_cli() -> None:
    """Hidden imports hide cycles; only the CLI imports lazily (``statectl --help`` start-up)."""
    hidden = []
    for p in _modules():
        rel = p.relative_to(ROOT)
        if rel.parts[1] == "cli" or rel.name == "cli.py":
            continue
        tree = ast.parse(p.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("statectl"):
                if id(node) not in top and not _in_type_checking(tree, node):
                    hidden.append(f"{rel}:{node.lineno} from {node.module}")
            elif isinstance(node, ast.Import) and id(node) not in top:
                names = [a.name for a in node.names if a.name.startswith("statectl")]
                if names:
                    hidden.append(f"{rel}:{node.lineno} import {', '.join(names)}")
    assert hidden == []


def _in_type_checking(tree: ast.Module, target: ast.AST) -> bool:
    return any(
        isinstance(node, ast.If)
        and "TYPE_CHECKING" in ast.unparse(node.test)
        and any(child is target for child in ast.walk(node))
        for node in tree.body
    )
