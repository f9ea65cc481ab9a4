"""Text every machine has, for `edgespec distill`: Python's standard library (its modules',
classes' and functions' docstrings, its small functions), pydoc's topics and the system's
licence texts (/usr/share/common-licenses). Standard library only; the same text in the same
order on every machine with the same Python and licences.

The built-in prompts (prompts.py) are made from it, and `teacher_texts()`: (prompt, reply
text) pairs whose replies the target reads rather than writes (teacher forcing, one prefill a
pair: many more training positions a minute than generating): Python's own documentation
(pydoc's topics), the standard library's docstrings and small functions, interleaved so that
a budget cut anywhere keeps every kind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _stdlib_modules() -> Iterator[tuple[str, Any]]:
    """(source, parsed tree) of each top-level module of Python's standard library, sorted."""
    import ast
    import sysconfig

    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError):
            continue
        tree.edgespec_name = path.stem  # type: ignore[attr-defined]
        yield source, tree


def stdlib_functions(n: int, max_lines: int = 14) -> list[str]:
    """Small top-level functions of Python's standard library (4 to `max_lines` lines),
    their docstrings cut out, one per module, in a fixed order."""
    import ast

    out: list[str] = []
    for source, tree in _stdlib_modules():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                if not body:
                    continue
                lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
                first = body[0].lineno - node.lineno
                code = "\n".join(lines[:1] + lines[first:]) + "\n"
                if 4 <= code.count("\n") <= max_lines and "\t" not in code:
                    out.append(code)
                    break
        if len(out) >= n:
            break
    return out


def stdlib_texts(n: int, per_module: int = 1) -> list[str]:
    """Prose paragraphs (250–700 characters) from the standard library's docstrings: its
    modules' first, then (`per_module` > 1) those of their classes and functions, at most
    `per_module` a module."""
    import ast

    out: list[str] = []
    for _, tree in _stdlib_modules():
        nodes = [tree] + [node for node in ast.walk(tree) if per_module > 1 and isinstance(
            node, ast.ClassDef | ast.FunctionDef)]  # fmt: skip
        taken = 0
        for node in nodes:
            for para in (ast.get_docstring(node) or "").split("\n\n"):
                text = " ".join(para.split())
                words = text.split()
                if 250 <= len(text) <= 700 and sum(w.isalpha() for w in words) > 0.7 * len(words):
                    out.append(text)
                    taken += 1
                    break
            if taken == per_module:
                break
        if len(out) >= n:
            break
    return out[:n]


def licence_texts(n: int, folder: Path = Path("/usr/share/common-licenses")) -> list[str]:
    """Prose paragraphs (250–700 characters) of the licence texts Debian-family systems keep
    in /usr/share/common-licenses (none where the folder is absent), one a file at most
    three, in a fixed order."""
    out: list[str] = []
    if not folder.is_dir():
        return out
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        try:
            paras = path.read_text(encoding="utf-8").split("\n\n")
        except (OSError, UnicodeDecodeError):
            continue
        taken = 0
        for para in paras:
            text = " ".join(para.split())
            words = text.split()
            if 250 <= len(text) <= 700 and sum(w.isalpha() for w in words) > 0.7 * len(words):
                out.append(text)
                taken += 1
                if taken == 3:
                    break
        if len(out) >= n:
            break
    return out[:n]


def _paragraph_chunks(text: str, chars: int) -> list[str]:
    """`text` in chunks of whole paragraphs up to about `chars` characters."""
    out, cur = [], ""
    for para in text.split("\n\n"):
        para = para.strip("\n")
        if not para.strip():
            continue
        if cur and len(cur) + len(para) > chars:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    if cur:
        out.append(cur)
    return out


def teacher_texts(chars: int = 900) -> list[tuple[str, str]]:
    """(prompt, reply) pairs from text every Python has (module doc), interleaved by kind."""
    import ast
    import inspect

    topics: list[tuple[str, str]] = []
    try:
        from pydoc_data.topics import topics as pydoc_topics
    except ImportError:  # pragma: no cover - a Python built without pydoc's data
        pydoc_topics = {}
    for name in sorted(pydoc_topics):
        text = pydoc_topics[name]
        title = text.split("\n", 1)[0].strip() or name
        for i, chunk in enumerate(_paragraph_chunks(text, chars)):
            ask = f"Explain {title} in Python." if i == 0 else f"Tell me more about {title}."
            topics.append((ask, chunk))
    modules: list[tuple[str, str]] = []
    docs: list[tuple[str, str]] = []
    code: list[tuple[str, str]] = []
    for source, tree in _stdlib_modules():
        mod_doc = ast.get_docstring(tree)
        mod = _module_name(tree, source)
        if mod.startswith("_"):
            continue
        if mod_doc and len(mod_doc) >= 200:
            modules.append((f"What is Python's {mod} module for?",
                            _paragraph_chunks(mod_doc, chars)[0]))  # fmt: skip
        lines = source.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 160:
                docs.append((f"What does {mod}.{node.name} do?",
                             _paragraph_chunks(inspect.cleandoc(doc), chars)[0]))  # fmt: skip
            text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            if isinstance(node, ast.FunctionDef) and 120 <= len(text) <= 2 * chars:
                code.append((f"Write the function {node.name} of Python's {mod} module.",
                             f"```python\n{text}\n```"))  # fmt: skip
    kinds = [topics, docs, code, modules]
    out: list[tuple[str, str]] = []
    for i in range(max(map(len, kinds))):
        out += [k[i] for k in kinds if i < len(k)]
    return out


def _module_name(tree: Any, source: str) -> str:
    """The module's name: the stem of the file `_stdlib_modules` read (kept on the tree)."""
    return getattr(tree, "edgespec_name", "this")
