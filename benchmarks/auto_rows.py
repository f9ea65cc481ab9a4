"""What bench_auto runs: its prompt sets, every edgespec row (label, bundle, load options) and
the private bundle views those rows load, and onnxruntime-genai's exports of the same pair.

Nothing here times or runs a generation: `bench_auto.py` times the rows in turns, each in its
worker (`auto_workers.py`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auto_workers import ESTIMATES, GENAI_K, ONE_POLICY
from bench_ar import export_genai, set_genai_threads
from common import cached_bundle, outdated

# every γ to 8: `auto` is judged against the best of them, and before stop 32 the list skipped
# 5 and 7, where 5 was the trained pair's best γ with its int4 draft (3% over 4 and 6)
FIXED = list(range(1, 9))
EXITS = [2, 4]


# --------------------------------------------------------------------------- prompt sets
@dataclass
class PromptSet:
    name: str
    ids: list[list[int]]
    temperature: float  # 0: greedy
    texts: list[str] = field(default_factory=list)  # the prompts as text (llama.cpp's CLI)
    other_cores: float = 0.0  # mean CPU other processes used while this set was timed

    def seed(self, i: int) -> int | None:
        return 1000 + i if self.temperature > 0 else None


# name -> (prompt file, style kept or None for all, sampled?)
SETS: dict[str, tuple[str, str | None, bool]] = {
    "code": ("prompts_code.jsonl", None, False),  # good: greedy code
    "words": ("prompts_text.jsonl", "words", False),  # bad: greedy random words
    "text": ("prompts_text.jsonl", None, True),  # high-entropy, sampled
}


def pair_bundle(models: Path, draft_quantize: str = "") -> Path:
    """The trained pair's bundle under `models` (exported once, again after retraining):
    `bundle`, or `bundle-draft-int8` / `-int4` with the draft quantized apart from the fp32
    target (`export --draft-quantize`)."""
    folder = models / (f"bundle-draft-{draft_quantize}" if draft_quantize else "bundle")
    extra = {"draft_quantize": draft_quantize} if draft_quantize else {}
    cached_bundle(models / "target", folder, draft=models / "draft", exit_layers=EXITS, **extra)
    return folder


def load_prompts(folder: Path, name: str, n: int) -> list[str]:
    file, style, _ = SETS[name]
    rows = [json.loads(line) for line in (folder / file).read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows if style is None or r.get("style") == style][:n]


# --------------------------------------------------------------------------- genai
def genai_export(checkpoint: Path, out: Path, python: str, threads: int) -> None:
    """genai's model builder on the local checkpoint (bench_ar's export), once; threads in
    its config."""
    if outdated(out / ".complete", checkpoint):
        export_genai(checkpoint, out, python)
        (out / ".complete").write_text("ok")
    set_genai_threads(out, threads)


def genai_spec_dir(target: Path, draft: Path, out: Path) -> Path:
    """A composite genai model: `model.type = "speculative"`, the target's decoder block and the
    draft's decoder block as `model.draft`, and a `speculative` section (onnxruntime-genai PRs
    #2233/#2287, docs/SpeculativeDecoding.md). genai refuses ".." in a config path, so the two
    exports are linked in as subfolders."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config = json.loads((target / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    drafter = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    for name, folder, block in (("target", target, decoder), ("draft", draft, drafter)):
        (out / name).symlink_to(folder.resolve(), target_is_directory=True)
        block["filename"] = f"{name}/{block['filename']}"
    config["model"].update(type="speculative", decoder=decoder, draft=drafter)
    config["speculative"] = {"max_draft_tokens": GENAI_K}
    (out / "genai_config.json").write_text(json.dumps(config, indent=4))
    for f in target.iterdir():  # tokenizer files
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


# --------------------------------------------------------------------------- edgespec
def bundle_view(bundle: Path, out: Path) -> Path:
    """The bundle's files, symlinked into `out`, without its calibration.json: a private
    place to calibrate (or not) that leaves the shared bundle alone."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in bundle.iterdir():
        if f.name != "calibration.json":
            (out / f.name).symlink_to(f.resolve())
    return out


def edgespec_configs(
    blind: Path,
    calibrated: Path,
    fixed_modes: list[str],
    quantized: dict[str, Path],
    one_policy: bool = False,
    estimates: dict[str, float] | None = None,
) -> list[tuple[str, Path, dict[str, Any]]]:
    """Every edgespec row: (label, bundle, load options). `quantized`: the bundles whose draft
    is quantized apart from the fp32 target (`--draft-quantize`), by method; fixed-mode
    `spec:int8` is spec on the int8 draft's bundle. `one_policy`: each spec+lookup auto row
    also with one policy over the chain (`ONE_POLICY`, see `load_row`). `estimates`: each
    blind auto row also with these constants of runtime/estimates.py (`ESTIMATES`)."""
    rows: list[tuple[str, Path, dict[str, Any]]] = [("ar", blind, {"mode": "ar"})]
    rows.append(("spec auto", blind, {"mode": "spec", "draft_policy": "auto"}))
    rows.append(("spec auto (calibrated)", calibrated, {"mode": "spec", "draft_policy": "auto"}))
    rows.append(("lookup auto", blind, {"mode": "lookup", "draft_policy": "auto"}))
    for k in EXITS:  # the target's own early exits (self-speculation)
        options = {"mode": "self-spec", "exit_layer": k, "draft_policy": "auto"}
        rows.append((f"self-spec@{k} auto", blind, options))
    # prompt lookup first, the draft model where lookup finds nothing (edgespec's n-gram
    # drafter combined with its draft model, the pair genai's two modes each use alone)
    rows.append(
        (
            "spec+lookup auto",
            blind,
            {"mode": "spec", "drafter": "lookup+draft", "draft_policy": "auto"},
        )
    )
    for q, folder in quantized.items():  # the same fp32 target, a draft that reads less
        for label, drafter in (("spec", "draft"), ("spec+lookup", "lookup+draft")):
            options = {"mode": "spec", "drafter": drafter, "draft_policy": "auto"}
            rows.append((f"{label} auto ({q} draft)", folder, options))
    if one_policy:
        for label, folder in [("", blind), *((f" ({q} draft)", f) for q, f in quantized.items())]:
            options = {"mode": "spec", "drafter": "lookup+draft", "draft_policy": "auto"}
            options[ONE_POLICY] = 1
            rows.append((f"spec+lookup auto, one policy{label}", folder, options))
    if estimates:  # an A/B of the estimators' constants, row by row
        what = ", ".join(f"{k} {v:g}" for k, v in estimates.items())
        for label, folder, options in list(rows):
            if label.endswith(("auto", "draft)")) and folder is not calibrated:
                rows.append((f"{label} [{what}]", folder, {**options, ESTIMATES: estimates}))
    for setup in fixed_modes:  # every fixed γ beside each auto row it is compared with
        mode, _, exit_layer = setup.partition("@")
        mode, _, q = mode.partition(":")
        extra = {"exit_layer": int(exit_layer)} if exit_layer else {}
        for g in FIXED:
            options = {"mode": mode, "draft_policy": f"fixed:{g}", **extra}
            rows.append((f"{setup} fixed:{g}", quantized[q] if q else blind, options))
    return rows


def row_of(label: str) -> str:
    """The row an --ab-estimates row repeats: "spec auto [SHRINK 3]" -> "spec auto"."""
    return label.split(" [")[0]
