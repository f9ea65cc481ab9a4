"""The built-in prompt set `edgespec distill` fits a draft on: instruct prompts made from text
every machine has — explanations and tips on a list of topics, functions to write, small
functions of Python's standard library to rewrite, comment or explain, its module docstrings
and the system's licence texts to summarise (texts.py), and chats that continue the target's
own replies (`follow_up`). The same list in the same order on every machine with the same
Python and licences.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgespec.distill.texts import licence_texts, stdlib_functions, stdlib_texts
from edgespec.runtime.errors import InputError

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


def prompt_source(text: str) -> str:
    """What a built-in prompt is made from: the text or code after its instruction, else the
    longest topic or task it names, else the prompt itself. Styles of one source make replies
    that share their subject (four prompts a topic, two summaries a text)."""
    if "\n\n" in text:
        return text.split("\n\n", 1)[1]
    named = [t for t in TOPICS + MORE_TOPICS + TASKS + MORE_TASKS if t in text]
    return max(named, key=len) if named else text


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


def read_prompts(path: Path) -> list[list[dict[str, str]]]:
    """A JSONL file of {"prompt": text} or {"messages": [{"role", "content"}, ...]} lines as
    conversations; an InputError naming the line that is neither."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--prompts {path}: cannot read it ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"--prompts {path}, line {n}: not JSON ({e})") from None
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            out.append([{"role": "user", "content": row["prompt"]}])
        elif (
            isinstance(row, dict)
            and isinstance(row.get("messages"), list)
            and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in row["messages"]
            )
        ):
            out.append([{"role": str(m.get("role", "user")), "content": m["content"]}
                        for m in row["messages"]])  # fmt: skip
        else:
            raise InputError(
                f'--prompts {path}, line {n}: expected {{"prompt": "..."}} or '
                '{"messages": [{"role": "user", "content": "..."}]}'
            )
    if not out:
        raise InputError(f"--prompts {path} holds no prompts")
    return out
