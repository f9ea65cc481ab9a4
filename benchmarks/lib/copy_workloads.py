"""Workloads where a model with no draft model speeds up only by copying (`benchmarks.trees`,
`benchmarks.trees_auto`): chat conversations whose later turns quote earlier replies, code
editing, rewriting / summarising, repeated agent-like requests; and completion prompts for
the code model."""

from __future__ import annotations

from typing import Any

SNIPPETS = (
    "def mean(values):\n    total = 0\n    count = 0\n    for v in values:\n"
    "        total += v\n        count += 1\n    if count == 0:\n        return 0\n"
    "    return total / count\n",
    "def tally(words):\n    x = {}\n    for w in words:\n        x[w] = x.get(w, 0) + 1\n"
    "    return x\n\nprint(tally(['a', 'b', 'a']))\n",
)
TEXTS = (
    "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. "
    "Supporters said the lanes make cycling safer and reduce traffic, while shop owners worried "
    "that removing parking spaces would hurt their business. After two hours of debate, the "
    "council voted to keep the lanes for a six-month trial.",
    "Solar panels turn sunlight into electricity using cells made of silicon. When light hits "
    "a cell, it frees electrons, which flow as an electric current. Panels work best in direct "
    "sunlight but still produce some power on cloudy days.",
)
PEOPLE = (
    "Anna is 34 and lives in Oslo.",
    "Ben, aged 27, moved to Lisbon last year.",
    "Carla lives in Rome; she is 45.",
    "David is a 52-year-old teacher from Leeds.",
)
# chat workloads: conversations; a list of user turns is one conversation whose later turns
# see the greedy replies to the earlier ones
CHAT: dict[str, list[list[str]]] = {
    "multi-turn": [
        [
            "Write a short paragraph about why regular exercise is good for you.",
            "Repeat that paragraph exactly, then add one sentence about sleep.",
            "Now write the same paragraph again as a numbered list of its sentences.",
        ]
    ],
    "code-edit": [
        [
            f"Here is a Python function:\n\n{code}\nAdd type hints and return the whole code.",
            "Now also add a docstring and return the whole code again.",
        ]
        for code in SNIPPETS
    ],
    "rewrite": [[f"Rewrite this text in simpler words:\n\n{t}"] for t in TEXTS]
    + [[f"Summarise this text in two sentences:\n\n{t}"] for t in TEXTS],
    "agent": [
        [
            "Extract the person's name, city and age from this sentence and answer with "
            f'JSON only, keys "name", "city", "age": {p}'
        ]
        for p in PEOPLE
    ],
}
# completion workloads for the code model: prompts
CODE: dict[str, list[str]] = {
    "code-edit": [f"{c}\n\n# the same code, tidied\n{c.splitlines()[0]}\n" for c in SNIPPETS],
    "agent": [f"def {name}(path):\n    " for name in ("read_config", "load_rows", "parse_log")],
}


def requests(model: Any, ar: Any, workload: Any, chat: bool, n_new: int) -> list[list[int]]:
    """The prompt ids of each request; a conversation's later turns carry `ar`'s replies."""
    if not chat:
        return [model.encode(text) for text in workload]
    out = []
    for turns in workload:
        messages: list[dict[str, str]] = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            ids = model.chat_session().prepare(messages).ids
            out.append(ids)
            reply = ar.generate(ids, max_new_tokens=n_new)
            messages.append({"role": "assistant", "content": reply.text})
    return out
