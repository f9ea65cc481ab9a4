"""The decoding modes by name, with the drafter and policy each defaults to (a leaf of the
standard library only: the CLI spells its `--mode` choices from it without loading numpy or
onnxruntime; `registry` resolves the names).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModeDefaults:
    drafter: str  # "exit" = exit:K at the chosen exit layer
    policy: str


MODES: dict[str, ModeDefaults] = {
    "ar": ModeDefaults("none", "fixed:0"),
    "spec": ModeDefaults("draft", "auto"),
    "self-spec": ModeDefaults("exit", "auto"),
    "lookup": ModeDefaults("lookup", "auto"),
    "suffix": ModeDefaults("suffix", "auto"),  # SuffixDecoding (runtime/suffix.py)
    "recycle": ModeDefaults("recycle", "auto"),  # Token Recycling (runtime/recycling.py)
    "split": ModeDefaults("", "placement"),  # drafter: the best the bundle has
}
