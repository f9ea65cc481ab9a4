"""The runtime never needs torch: an app installs numpy + onnxruntime (+ click, jinja2) only; and
edgespec's own modules import one way (runtime/ never imports serve/, export/ or cli; no
import circles) and stay short."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import edgespec

PACKAGE = Path(edgespec.__file__).parent
RUNTIME_FILES = [
    *PACKAGE.glob("runtime/**/*.py"),
    *PACKAGE.glob("devices/*.py"),
    PACKAGE / "bundle.py",
    PACKAGE / "__init__.py",
]
ALLOWED = {"numpy", "onnxruntime", "edgespec", "click", "jinja2"}

BLOCK_HEAVY = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'transformers', 'tokenizers', 'onnx', 'coremltools',
                                  'safetensors', 'tqdm'}:
            raise ImportError(f'{name} is blocked in this test')
sys.meta_path.insert(0, Block())
"""


# optional packages a runtime module may import inside a function, only on the path that
# needs them: coremltools when an app opens Core ML packages, websockets (the [serve] extra)
# when split mode connects to a server, llguidance (the [grammar] extra) when a request asks
# for a response_format (test_generate_runs_with_torch_unimportable checks that ordinary use
# never does)
LAZY_OPTIONAL = {
    "coreml.py": "coremltools",
    "websocket.py": "websockets",
    "engine.py": "llguidance",
}


def _lazy_optional_imports(tree: ast.AST, package: str) -> set[ast.AST]:
    lazy = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                else:
                    continue
                if all(n.split(".")[0] == package for n in names):
                    lazy.add(node)
    return lazy


def test_runtime_modules_import_only_numpy_onnxruntime_and_stdlib():
    for path in RUNTIME_FILES:
        tree = ast.parse(path.read_text())
        package = LAZY_OPTIONAL.get(path.name)
        lazy = _lazy_optional_imports(tree, package) if package else set()
        for node in ast.walk(tree):
            if node in lazy:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top in ALLOWED or top in sys.stdlib_module_names, (
                    f"{path.name} imports {name}"
                )


def test_generate_runs_with_torch_unimportable(bundles):
    code = (
        BLOCK_HEAVY
        + f"""
import edgespec
m = edgespec.load({str(bundles["llama-gqa-tied"])!r}, verifier='exit:2')
g = m.generate('hello world', max_new_tokens=5, ignore_eos=True)
assert len(g.tokens) == 5
assert not any(k.split('.')[0] in ('torch', 'transformers') for k in sys.modules)
print('ok')
"""
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


def test_cli_generate_and_inspect_run_with_torch_unimportable(bundles):
    code = (
        BLOCK_HEAVY
        + """
from edgespec.cli import main
main()
"""
    )
    b = str(bundles["qwen2"])
    for args in (["generate", b, "-p", "x = 1", "-n", "4"], ["inspect", b]):
        run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr


# ------------------------------------------------------------ edgespec's own import graph
# Layers point one way: cli -> serve/export -> runtime -> bundle/devices. The graph is read
# statically (ast) from every module of the package, function-local imports included: a
# lazy import still runs, so it still makes a circle or climbs a layer. Imports under
# `if TYPE_CHECKING:` count too: a module that names another's types depends on its design,
# and a circle hidden from the interpreter is still a circle for whoever reads the code.
LAYERS_ABOVE_RUNTIME = (
    "edgespec.serve",
    "edgespec.export",
    "edgespec.distill",
    "edgespec.cli",
    "edgespec.tools",
    "edgespec.demo",
)
# what the runtime stands on imports nothing of edgespec above it
LEAVES = ("edgespec.bundle", "edgespec.devices", "edgespec.protocol", "edgespec.errors")
MAX_MODULE_LINES = 400


BENCHMARKS = PACKAGE.parent / "benchmarks"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p, PACKAGE.parent): p for p in sorted(PACKAGE.rglob("*.py"))}
# the benchmarks package (`python -m benchmarks.NAME`), when this is a checkout
BENCH_MODULES = {
    _module_name(p, PACKAGE.parent): p
    for p in sorted(BENCHMARKS.rglob("*.py"))
    if "results" not in p.parts
}


def _own_imports(name: str, modules: dict[str, Path] = MODULES) -> list[tuple[str, int]]:
    """(own module imported, line) for every import in module `name` of `modules`."""
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:  # relative: up from this module's package
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    module = ".".join(base + ([module] if module else []))
                for a in child.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{module}.{a.name}".strip(".")
                    found.append((sub if _known(sub, modules) else module, child.lineno))
            visit(child)

    visit(ast.parse(path.read_text()))
    named = [(_known(m, modules), line) for m, line in found]
    return [(m, line) for m, line in named if m is not None and m != name]


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The module of `modules` that an import of `name` loads (None: not one of them)."""
    return name if name in modules else None


def _cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Per circle (strongly connected part): one cycle through it, as a path back to its
    start, and the circle's other members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    parts: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan; the package is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while not part or v not in part:
                part.add(stack.pop())
            if len(part) > 1:
                parts.append(part)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for part in parts:  # shortest way from the smallest name back to itself, inside the part
        start = min(part)
        paths = {w: [start, w] for w in sorted(graph[start] & part)}
        frontier = list(paths)
        while start not in paths:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & part):
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        cycles.append((paths[start], sorted(part - set(paths[start]))))
    return cycles


def test_import_graph_reader_finds_local_relative_submodule_and_type_only_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    for name in ("__init__", "a", "b", "c", "d", "e"):
        (tmp_path / "pkg" / f"{name}.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from pkg import b\n"  # the submodule, not the package
        "from . import c\n"
        "if TYPE_CHECKING:\n    from pkg.d import Thing\n"
        "def f():\n    import pkg.e\n"
    )
    modules = {_module_name(p, tmp_path): p for p in sorted(tmp_path.rglob("*.py"))}
    edges = {m for m, _ in _own_imports("pkg.a", modules)}
    assert edges == {"pkg.b", "pkg.c", "pkg.d", "pkg.e"}
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a", "e"}, "d": {"a"}, "e": {"b"}}
    assert _cycles(ring) == [(["a", "b", "c", "a"], ["e"])]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_runtime_never_imports_serve_export_or_cli():
    climbs = [
        f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {imported}"
        for name in MODULES
        if name == "edgespec.runtime" or name.startswith("edgespec.runtime.")
        for imported, line in _own_imports(name)
        if imported.startswith(LAYERS_ABOVE_RUNTIME)
    ]
    assert not climbs, "runtime/ climbs a layer:\n" + "\n".join(climbs)


def test_bundle_devices_protocol_and_errors_import_nothing_above_them():
    climbs = [
        f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {imported}"
        for name in MODULES
        if name.startswith(LEAVES)
        for imported, line in _own_imports(name)
        if imported.startswith(("edgespec.runtime", *LAYERS_ABOVE_RUNTIME))
    ]
    assert not climbs, "a leaf climbs a layer:\n" + "\n".join(climbs)


def test_no_import_cycles_among_edgespec_modules():
    graph = {name: {m for m, _ in _own_imports(name)} for name in MODULES}
    cycles = _cycles(graph)
    lines = [
        " -> ".join(path) + (f"  (also in this circle: {', '.join(rest)})" if rest else "")
        for path, rest in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(lines)


def test_no_import_cycles_among_benchmark_scripts():
    graph = {name: {m for m, _ in _own_imports(name, BENCH_MODULES)} for name in BENCH_MODULES}
    assert any(graph.values()), "no benchmark module imports another: is benchmarks/ read?"
    cycles = _cycles(graph)
    lines = [
        " -> ".join(path) + (f"  (also in this circle: {', '.join(rest)})" if rest else "")
        for path, rest in cycles
    ]
    assert not cycles, "import cycles in benchmarks/:\n" + "\n".join(lines)


# edgespec/runtime/ by concept: the loop (decode), the round's contracts (round, stats, tree,
# draft_q, sampling, errors), the name tables (names, modes), config, the registry and the
# model at the top; a folder per part of a round under it (graphs/, drafters/, policies/,
# verify/, split/, chat/, grammar/, tokenizer/). Read as one unit each (a folder, or a module
# at the top), the runtime's imports point one way: no circle between units.
MAX_FOLDER_MODULES = 15
RUNTIME = "edgespec.runtime"


def _runtime_unit(name: str) -> str:
    """The unit a runtime module belongs to: its folder under runtime/, or itself."""
    return ".".join(name.split(".")[:3])


def test_no_runtime_folder_holds_more_than_15_modules():
    runtime = PACKAGE / "runtime"
    folders = [runtime, *(p for p in runtime.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    crowded = {
        str(folder.relative_to(PACKAGE.parent)): n
        for folder in folders
        if (n := sum(1 for p in folder.glob("*.py") if p.name != "__init__.py"))
        > MAX_FOLDER_MODULES
    }
    assert not crowded, f"runtime folders over {MAX_FOLDER_MODULES} modules: {crowded}"


def _unit_graph(
    modules: dict[str, Path] = MODULES,
) -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """The runtime's units and their imports of each other; per arrow, one import making it."""
    graph: dict[str, set[str]] = {}
    arrows: dict[tuple[str, str], str] = {}
    for name in modules:
        if not name.startswith(RUNTIME + "."):
            continue
        unit = _runtime_unit(name)
        graph.setdefault(unit, set())
        for imported, line in _own_imports(name, modules):
            other = _runtime_unit(imported)
            if imported.startswith(RUNTIME + ".") and other != unit:
                graph[unit].add(other)
                graph.setdefault(other, set())
                arrows.setdefault((unit, other), f"{modules[name].name}:{line}")
    return graph, arrows


def test_runtime_folders_import_one_way():
    graph, arrows = _unit_graph()
    assert len(graph) > 10, "the runtime's units were not read"
    lines = []
    for path, rest in _cycles(graph):
        lines.append(" -> ".join(path) + (f"  (also: {', '.join(rest)})" if rest else ""))
        lines += [f"    {a} -> {b}: {arrows[a, b]}" for a, b in zip(path, path[1:], strict=False)]
    assert not lines, "runtime units import each other both ways:\n" + "\n".join(lines)


def test_the_layout_reader_sees_a_folder_and_a_top_module_importing_each_other(tmp_path):
    runtime = tmp_path / "edgespec" / "runtime"
    (runtime / "plans").mkdir(parents=True)
    for name in ("__init__", "plans/__init__"):
        (runtime / f"{name}.py").write_text("")
    (runtime / "plans" / "spans.py").write_text("from edgespec.runtime.table import TABLE\n")
    (runtime / "plans" / "length.py").write_text("X = 1\n")
    (runtime / "table.py").write_text(
        "def build():\n    from edgespec.runtime.plans import length\n"
    )
    (runtime / "decode.py").write_text("from edgespec.runtime.plans.length import X\n")
    modules = {_module_name(p, tmp_path): p for p in sorted(tmp_path.rglob("*.py"))}
    graph, arrows = _unit_graph(modules)
    # no circle between modules, but one between the plans folder and the table
    assert not _cycles({m: {i for i, _ in _own_imports(m, modules)} for m in modules})
    circle = ["edgespec.runtime.plans", "edgespec.runtime.table", "edgespec.runtime.plans"]
    assert _cycles(graph) == [(circle, [])]
    assert arrows["edgespec.runtime.plans", "edgespec.runtime.table"] == "spans.py:1"
    assert graph["edgespec.runtime.decode"] == {"edgespec.runtime.plans"}


def test_no_edgespec_module_over_400_lines():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_chat_runs_with_torch_unimportable(chat_bundle):
    code = (
        BLOCK_HEAVY
        + f"""
import edgespec
m = edgespec.load({str(chat_bundle)!r}, mode='spec')
s = m.chat_session(system='Be brief.')
r1 = s.reply([{{'role': 'user', 'content': 'hi'}}], None)
r2 = m.chat([{{'role': 'user', 'content': 'hi'}}], max_new_tokens=4, stop=['x'])
assert r1.tokens and r2.tokens
assert not any(k.split('.')[0] in ('torch', 'transformers') for k in sys.modules)
print('ok')
"""
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
