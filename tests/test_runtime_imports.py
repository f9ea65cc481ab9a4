"""The runtime never needs torch: an app installs numpy + onnxruntime (+ click) only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import edgespec

PACKAGE = Path(edgespec.__file__).parent
RUNTIME_FILES = [
    *PACKAGE.glob("runtime/*.py"),
    *PACKAGE.glob("devices/*.py"),
    PACKAGE / "bundle.py",
    PACKAGE / "__init__.py",
]
ALLOWED = {"numpy", "onnxruntime", "edgespec", "click"}

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
# when split mode connects to a server (test_generate_runs_with_torch_unimportable checks
# that ordinary use never does)
LAZY_OPTIONAL = {"coreml.py": "coremltools", "link.py": "websockets"}


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
