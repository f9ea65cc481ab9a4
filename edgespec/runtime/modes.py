"""The decoding modes by name, with the drafter and policy each defaults to (a leaf of the
standard library only: the CLI spells its `--mode` choices from it without loading numpy or
onnxruntime; `registry` resolves the names).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModeDefaults:
    drafter: str  # "exit" = exit:K at the chosen exit layer; "": the best the bundle has
    policy: str
    help: str  # what it drafts with, for --mode's help


MODES: dict[str, ModeDefaults] = {
    "ar": ModeDefaults("none", "fixed:0", "plain decoding"),
    "spec": ModeDefaults("draft", "auto", "draft model"),
    "self-spec": ModeDefaults("exit", "auto", "early exit"),
    # runtime/drafters/eagle.py
    "eagle": ModeDefaults("eagle", "auto", "feature head (edgespec distill)"),
    "lookup": ModeDefaults("lookup", "auto", "prompt lookup"),
    "suffix": ModeDefaults("suffix", "auto", "SuffixDecoding"),  # runtime/drafters/suffix.py
    "recycle": ModeDefaults("recycle", "auto", "Token Recycling"),  # runtime/drafters/recycling.py
    "split": ModeDefaults("", "placement", "draft here, verify on --server"),
}
# the drafter a default `spec` runs (a load, the server or a split device choosing for a
# bundle with a draft model): prompt lookup first, the draft model where lookup finds nothing
# to copy. On SmolLM2-135M-Instruct's Q4_1 file with its distilled draft the chain beat the
# draft alone on every instruct workload (x `ar`: 1.22 / 1.46 / 1.90 / 2.11 against 1.10 /
# 1.14 / 0.98 / 1.07, benchmarks/RESULTS.md), as spec+lookup did on the trained pair
DEFAULT_SPEC_DRAFTER = "lookup+draft"
# the drafter a default `eagle` runs (a load or the server choosing for a bundle with a feature
# head): prompt lookup first, where the reply copies the prompt, the head elsewhere
DEFAULT_EAGLE_DRAFTER = "lookup+eagle"
