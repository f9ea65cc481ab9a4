"""Instruct prompts for a real chat model: the workloads `real` measures (open questions, code
rewriting, summarising a given text, a multi-turn chat, as conversations), and the prompts whose
replies a model is fitted on (`own_prompts`: exit adapters, `distill_draft`'s training set). No
fitting prompt is a workload's.
"""

from __future__ import annotations

WORKLOADS: dict[str, list[list[dict[str, str]]]] = {
    "question": [
        [{"role": "user", "content": "Why is the sky blue? Answer in a short paragraph."}],
        [{"role": "user", "content": "What are three good habits for staying healthy?"}],
    ],
    "code-rewrite": [
        [
            {
                "role": "user",
                "content": "Rewrite this Python function with type hints and a docstring, "
                "keeping its logic:\n\ndef mean(values):\n    total = 0\n    count = 0\n"
                "    for v in values:\n        total += v\n        count += 1\n"
                "    if count == 0:\n        return 0\n    return total / count\n",
            }
        ],
        [
            {
                "role": "user",
                "content": "Rename the variable x to count in this code and return the "
                "whole code:\n\ndef tally(words):\n    x = {}\n    for w in words:\n"
                "        x[w] = x.get(w, 0) + 1\n    return x\n\nprint(tally(['a', 'b', 'a']))\n",
            }
        ],
    ],
    "summarise": [
        [
            {
                "role": "user",
                "content": "Summarise this text in two sentences:\n\nThe city council met on "
                "Tuesday to discuss the new bicycle lanes on Main Street. Supporters said the "
                "lanes make cycling safer and reduce traffic, while shop owners worried that "
                "removing parking spaces would hurt their business. After two hours of debate, "
                "the council voted to keep the lanes for a six-month trial and to add parking "
                "on two side streets. The results of the trial will be reviewed in the spring.",
            }
        ],
        [
            {
                "role": "user",
                "content": "Summarise the main points of this text:\n\nSolar panels turn "
                "sunlight into electricity using cells made of silicon. When light hits a cell, "
                "it frees electrons, which flow as an electric current. Panels work best in "
                "direct sunlight but still produce some power on cloudy days. Most home systems "
                "are connected to the grid, so extra power can be sold back to the utility. "
                "Batteries can store power for use at night.",
            }
        ],
    ],
    "chat": [
        [
            {"role": "user", "content": "I want to learn to cook. Where should I start?"},
            {
                "role": "assistant",
                "content": "Start with simple dishes such as eggs, pasta and rice. Learn to "
                "use a knife safely and to control the heat of your pan.",
            },
            {"role": "user", "content": "Give me a simple pasta recipe for two people."},
        ],
    ],
}


def own_prompts() -> list[str]:
    """The product's core prompts (`edgespec.distill.prompts`; imported when asked for: lib
    loads nothing heavy)."""
    from edgespec.distill import prompts

    return prompts.own_prompts()


def fitting_prompts() -> list[str]:
    """The product's prompt set (`edgespec.distill.prompts`) without the workloads here."""
    from edgespec.distill import prompts

    held_out = frozenset(m["content"] for convs in WORKLOADS.values() for c in convs for m in c)
    return prompts.fitting_prompts(held_out)


__all__ = ["WORKLOADS", "fitting_prompts", "own_prompts"]
