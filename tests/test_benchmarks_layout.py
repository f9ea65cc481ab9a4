"""`benchmarks/` is a library and scenarios: a scenario imports only `benchmarks.lib` (never
another scenario), no file edits `sys.path`, `lib/` has no import circle (imports inside
functions counted), and importing `lib` loads no heavy package (the onnxruntime-genai and
llama.cpp workers import it in interpreters of their own)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_scenarios_import_only_lib_and_never_edit_sys_path():
    for path in BENCH.rglob("*.py"):
        ours = {n for n in imported(path) if n.startswith("benchmarks.")}
        others = {n for n in ours if not n.startswith("benchmarks.lib")}
        assert not others, f"{path.relative_to(ROOT)} imports {sorted(others)}"
        assert "sys.path" not in path.read_text(), f"{path.relative_to(ROOT)} edits sys.path"


def test_lib_has_no_import_circle():
    modules = {p.stem: p for p in (BENCH / "lib").glob("*.py") if p.stem != "__init__"}
    edges = {
        m: {n.split(".")[2] for n in imported(p) if n.startswith("benchmarks.lib.")} & set(modules)
        for m, p in modules.items()
    }

    def visit(m: str, path: list[str]) -> None:
        assert m not in path, f"import circle in benchmarks/lib: {' -> '.join([*path, m])}"
        for n in edges[m]:
            visit(n, [*path, m])

    for m in modules:
        visit(m, [])


def test_importing_lib_loads_no_heavy_package():
    names = ", ".join(f"benchmarks.lib.{p.stem}" for p in (BENCH / "lib").glob("*.py"))
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in '{names}'.split(', ')]; "
        "heavy = {'torch', 'transformers', 'onnxruntime', 'edgespec', 'numpy'} & set(sys.modules); "
        "sys.exit(f'loaded {sorted(heavy)}' if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
