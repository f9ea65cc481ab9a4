"""The built-in prompt set `edgespec distill` fits a draft on: instruct prompts made from text
every machine has — explanations and tips on a list of topics, functions to write, small
functions of Python's standard library to rewrite, comment or explain, its module docstrings
and the system's licence texts (/usr/share/common-licenses) to summarise. Standard library
only; the same list in the same order on every machine with the same Python and licences.

`teacher_texts()`: (prompt, reply text) pairs whose replies the target reads rather than
writes (teacher forcing, one prefill a pair: many more training positions a minute than
generating): Python's own documentation (pydoc's topics), the standard library's docstrings
and small functions, interleaved so that a budget cut anywhere keeps every kind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOPICS = (
    "photosynthesis",
    "how vaccines work",
    "the water cycle",
    "inflation",
    "black holes",
    "the French revolution",
    "how a bicycle stays upright",
    "compound interest",
    "tides",
    "why we sleep",
    "how bread rises",
    "plate tectonics",
    "the immune system",
    "rainbows",
    "how batteries work",
    "machine learning",
    "the printing press",
    "volcanoes",
)
TASKS = (
    "reverses a string",
    "checks whether a number is prime",
    "counts the vowels in a text",
    "returns the largest of three numbers",
    "merges two sorted lists",
    "computes a factorial",
    "removes duplicates from a list keeping order",
    "converts Celsius to Fahrenheit",
    "reads a file and counts its lines",
    "finds the most common word in a text",
)
SNIPPETS = (
    "def total(xs):\n    s = 0\n    for x in xs:\n        s = s + x\n    return s\n",
    "def is_even(n):\n    if n % 2 == 0:\n        return True\n    else:\n        return False\n",
    "def greet(name):\n    print('Hello, ' + name + '!')\n\ngreet('Ada')\n",
    "def squares(n):\n    out = []\n    for i in range(n):\n        out.append(i * i)\n"
    "    return out\n",
)
TEXTS = (
    "The museum will open a new wing next month. It will show art from local painters and "
    "host weekend workshops for children. Entry to the new wing is free for the first week.",
    "Researchers found that short walks after meals help control blood sugar. Even ten "
    "minutes made a difference, and the effect was strongest after dinner.",
    "The town plans to plant two thousand trees along its main roads. The trees will give "
    "shade, clean the air and make the streets quieter. Volunteers can sign up online.",
)


def own_prompts() -> list[str]:
    out = [f"Explain {t} in a short paragraph." for t in TOPICS]
    out += [f"Write a Python function that {t}." for t in TASKS]
    out += [f"Rewrite this code to be clearer and add type hints:\n\n{c}" for c in SNIPPETS]
    out += [f"Summarise this text in one or two sentences:\n\n{t}" for t in TEXTS]
    out += [f"Give three tips about {t}." for t in TOPICS[:8]]
    return out


MORE_TOPICS = (
    "the moon's phases",
    "how airplanes fly",
    "recycling",
    "the stock market",
    "earthquakes",
    "how the heart works",
    "electric cars",
    "the Roman empire",
    "climate change",
    "DNA",
    "how computers store numbers",
    "the internet",
    "magnets",
    "the seasons",
    "coral reefs",
    "how a refrigerator works",
    "the solar system",
    "honeybees",
    "democracy",
    "gravity",
    "how to learn a language",
    "time zones",
    "the Olympic games",
    "wind power",
    "deserts",
    "how the eye sees colour",
    "money",
    "the periodic table",
    "friction",
    "the ocean",
    "how plants grow",
    "sound waves",
    "public libraries",
    "the human brain",
    "glaciers",
    "how a camera works",
    "saving money",
    "the first computers",
    "healthy breakfasts",
    "bridges",
    "learning to play the guitar",
    "spiders",
    "the Great Wall of China",
    "how soap cleans",
    "electricity at home",
    "the rain forest",
    "writing a good essay",
    "chess",
    "time management",
    "how maps are made",
)
MORE_TASKS = (
    "sorts a list of words by length",
    "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number",
    "flattens a nested list",
    "counts words in a sentence",
    "computes the average of a list of numbers",
    "returns the second largest number in a list",
    "checks whether two words are anagrams",
    "converts a number to binary",
    "capitalises every word in a sentence",
    "sums the digits of a number",
    "finds all even numbers in a list",
    "reverses the words of a sentence",
    "computes the greatest common divisor of two numbers",
    "checks whether a year is a leap year",
    "returns the keys of a dictionary sorted by value",
    "splits a list into chunks of size n",
    "validates a simple email address",
    "computes the area of a circle",
    "counts how often each character appears in a string",
)
STYLES = (
    "Explain {} in a short paragraph.",
    "Give three tips about {}.",
    "What is the most important thing to know about {}? Answer briefly.",
    "Explain {} to a ten-year-old.",
    "Write two sentences about {}.",
)
CODE_STYLES = (
    "Write a Python function that {}.",
    "Write a short Python function that {}, with a docstring.",
    "How would you write a function in Python that {}? Show the code.",
)
REWRITES = (
    "Rewrite this Python function with type hints and a docstring, keeping its logic:\n\n{}",
    "Explain what this Python code does:\n\n{}",
    "Add comments to this code:\n\n{}",
    "Rewrite this code to be clearer:\n\n{}",
    "Rename the variables in this code to clearer names and return the whole code:\n\n{}",
)
SUMMARIES = (
    "Summarise this text in two sentences:\n\n{}",
    "Summarise the main points of this text:\n\n{}",
    "Rewrite this text in simpler words:\n\n{}",
)


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


def fitting_prompts(exclude: frozenset[str] = frozenset()) -> list[str]:
    """`own_prompts` and several hundred more of the same kinds, for distilling a draft;
    none of `exclude` (a benchmark's held-out workloads)."""
    topics = TOPICS + MORE_TOPICS
    out = own_prompts()
    out += [s.format(t) for t in topics for s in STYLES[1:]]
    out += [s.format(t) for t in TASKS + MORE_TASKS for s in CODE_STYLES]
    out += [s.format(c) for i, c in enumerate(stdlib_functions(80)) for s in REWRITES[i % 5 :][:2]]
    texts = stdlib_texts(240, per_module=3) + licence_texts(48)
    out += [s.format(t) for i, t in enumerate(texts) for s in (SUMMARIES * 2)[i % 3 :][:2]]
    return [p for p in dict.fromkeys(out) if p not in exclude]


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


KINDS = ("question", "code", "summary")
# a second user turn after the target's own first reply makes a chat ("chat": its kind)
FOLLOW_UPS = {
    "question": (
        "Can you give me an example?",
        "Explain that more simply.",
        "Sum that up in one sentence.",
        "What do people often get wrong about this?",
        "Why does that matter in everyday life?",
    ),
    "code": (
        "Explain how it works, briefly.",
        "How would you test it?",
        "Can you make it shorter?",
        "What happens with an empty input?",
    ),
    "summary": ("Which point matters most, and why?", "Say it in one sentence."),
}


def follow_up(conversation: list[dict[str, str]], reply: str, i: int) -> list[dict[str, str]]:
    """`conversation` with its reply and a second user turn (the `i`-th follow-up of its
    kind): a multi-turn chat whose first answer is the target's own."""
    asks = FOLLOW_UPS[prompt_kind(conversation[-1]["content"])]
    return [*conversation, {"role": "assistant", "content": reply},
            {"role": "user", "content": asks[i % len(asks)]}]  # fmt: skip


def conversation_kind(conversation: list[dict[str, str]]) -> str:
    """ "chat" for a conversation of more than one user turn, else its prompt's kind."""
    if sum(m.get("role") == "user" for m in conversation) > 1:
        return "chat"
    return prompt_kind(conversation[-1]["content"]) if conversation else "question"


def prompt_kind(text: str) -> str:
    """Which workload a built-in prompt stands for: "summary" (summarise or simplify a text),
    "code" (write, rewrite, comment or explain code) or "question" (explain, tips, facts)."""
    head = text.split("\n", 1)[0]
    if head.startswith(("Summarise", "Rewrite this text")):
        return "summary"
    if "\n" in text or "Python" in head or " code" in head:
        return "code"
    return "question"


def by_kind(prompts: list[str]) -> list[str]:
    """`prompts` interleaved by `prompt_kind` (a question, a code prompt, a summary, ...; each
    kind in its order), so that a budget that ends anywhere has replies of every kind."""
    kinds: dict[str, list[str]] = {k: [] for k in KINDS}
    for p in prompts:
        kinds[prompt_kind(p)].append(p)
    out: list[str] = []
    for i in range(max(map(len, kinds.values()), default=0)):
        out += [k[i] for k in kinds.values() if i < len(k)]
    return out


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
