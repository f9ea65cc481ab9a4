"""Build the 11M code model's bundle (a test and benchmark fixture, outside the wheel): the
trained pair of train_models.py, exported small.

Takes the trained target + draft (`--models`, default ~/.cache/edgespec-bench/trained, made by
`python -m benchmarks.train_models`). Guarantees: `--out` (default tests/fixtures/code_model)
holds an edgespec bundle of the target with early exits at layers 2 and 4 and the draft,
the target's weights as `--quantize` says (default none: fp32. Why not int8, which is 4x smaller
and 2.5x faster for plain decoding: at int8 this 11M model takes ~0.7 ms a token, nearly all of
it onnxruntime's fixed cost per graph call rather than reading weights, so a draft step costs
about what a target step does and no drafter can win; a real model's steps are memory-bound,
as this model's are in fp32, which is what the demo is there to show) and the draft's as
`--draft-quantize` says (default int4: the output is the fp32 target's whatever the draft's
precision, and a draft step takes 0.15 ms instead of 0.34 ms; 45 MiB in all), checked by the
exporter against transformers, plus `provenance.json` (training steps, held-out losses, the
command). The runtime loads it with numpy + onnxruntime only, so
`edgespec demo --bundle tests/fixtures/code_model` needs no torch.

    python -m benchmarks.train_models          # once (~35 min on 2 cores, cached)
    python -m benchmarks.build_demo_bundle     # ~1 min; then:
    edgespec demo --bundle tests/fixtures/code_model
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXITS = [2, 4]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=Path.home() / ".cache/edgespec-bench/trained")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "code_model")
    ap.add_argument("--quantize", choices=("int8", "int4", "none"), default="none")
    ap.add_argument(
        "--draft-quantize",
        choices=("int8", "int4", "none"),
        default="int4",
        help="the draft's weights (the output is the target's whatever they are)",
    )
    args = ap.parse_args(argv)
    models: Path = args.models.expanduser()
    for part in ("target", "draft"):
        if not (models / part / "train_info.json").exists():
            sys.exit(f"{models / part} is not trained yet: run python -m benchmarks.train_models")
    from edgespec.export import export_bundle

    if args.out.exists():
        shutil.rmtree(args.out)
    export_bundle(
        models / "target",
        args.out,
        draft=models / "draft",
        exit_layers=EXITS,
        quantize=None if args.quantize == "none" else args.quantize,
        draft_quantize=args.draft_quantize,
        overwrite=True,
    )
    info = {
        part: {
            k: json.loads((models / part / "train_info.json").read_text())[k]
            for k in ("parameters", "steps_done", "tokens_seen", "heldout")
        }
        for part in ("target", "draft")
    }
    info["built_by"] = "python -m benchmarks.train_models && python -m benchmarks.build_demo_bundle"
    info["quantize"] = args.quantize
    info["draft_quantize"] = args.draft_quantize
    info["exit_layers"] = EXITS
    (args.out / "provenance.json").write_text(json.dumps(info, indent=2) + "\n")
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
