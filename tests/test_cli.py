"""The command line: export, generate, inspect and devices (the demo: tests/test_demo.py)."""

from __future__ import annotations

from click.testing import CliRunner

from edgespec.cli import main


def test_export_then_generate_with_stats_then_inspect(checkpoints, tmp_path):
    runner = CliRunner()
    out = tmp_path / "b"
    r = runner.invoke(
        main, ["export", str(checkpoints["gpt2"]), "--out", str(out), "--exit-layers", "1,3"]
    )
    assert r.exit_code == 0, r.output
    assert "full, head@1, tail@1, head@3, tail@3" in r.output
    r = runner.invoke(
        main, ["generate", str(out), "-p", "def f(x):", "-n", "8", "--stats", "--ignore-eos"]
    )
    assert r.exit_code == 0, r.output
    assert "prefill:" in r.stderr and "decode: 7 tokens" in r.stderr
    r = runner.invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "gpt2" in r.output and "tail@3" in r.output


def test_generate_sampling_options_and_no_stream(bundles):
    r = CliRunner().invoke(
        main,
        [
            "generate",
            str(bundles["qwen2"]),
            "-p",
            "a",
            "-n",
            "5",
            "-t",
            "0.8",
            "--top-p",
            "0.9",
            "--seed",
            "3",
            "--no-stream",
        ],
    )
    assert r.exit_code == 0, r.output


def test_bad_exit_layers_option_is_explained(checkpoints, tmp_path):
    r = CliRunner().invoke(
        main,
        ["export", str(checkpoints["gpt2"]), "-o", str(tmp_path / "x"), "--exit-layers", "two"],
    )
    assert r.exit_code == 2 and "not a comma-separated list" in r.output


def test_devices_lists_cpu(bundles):
    r = CliRunner().invoke(main, ["devices"])
    assert r.exit_code == 0 and "CPUExecutionProvider" in r.output
    cpu_row = next(line for line in r.output.splitlines() if line.startswith("cpu "))
    assert cpu_row.split()[1] == "yes"


def test_generate_speculative_mode_prints_speculation_stats(spec_bundles):
    r = CliRunner().invoke(
        main,
        [
            "generate",
            str(spec_bundles["qwen2"]),
            "-p",
            "x = [1, 2, 3]",
            "-n",
            "12",
            "--mode",
            "self-spec",
            "--draft-policy",
            "dynamic-exit",
            "--stats",
            "--ignore-eos",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "speculation:" in r.stderr and "accepted-length histogram" in r.stderr


def test_bad_policy_is_one_error_line(spec_bundles):
    r = CliRunner().invoke(
        main,
        [
            "generate",
            str(spec_bundles["qwen2"]),
            "-p",
            "x",
            "--mode",
            "spec",
            "--draft-policy",
            "fast",
        ],
    )
    assert r.exit_code == 1 and "is not one of: fixed:N" in r.output


def test_an_unknown_drafter_is_one_error_line_naming_every_drafter(spec_bundles):
    from edgespec.runtime.names import DRAFTER_NAMES

    for bad in ("nonsense", "lookup+nonsense", "draft:2"):
        args = ["generate", str(spec_bundles["qwen2"]), "-p", "x", "--drafter", bad]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and "Traceback" not in r.output, (bad, r.output)
        assert f"drafter {bad.split('+')[-1]!r} is not one of: " in r.output, r.output
        assert all(d.spelling in r.output for d in DRAFTER_NAMES.values()), r.output
        assert "a chain such as lookup+draft" in r.output


def _help(*command: str) -> str:
    r = CliRunner().invoke(main, [*command, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())  # one line: click wraps at any space


def test_decoding_help_names_every_drafter_policy_and_mode_from_the_tables():
    from edgespec.runtime.modes import MODES
    from edgespec.runtime.names import DRAFTER_NAMES, POLICY_NAMES

    for command in ("generate", "chat"):
        text = _help(command)
        for d in DRAFTER_NAMES.values():
            assert f"{d.spelling} ({d.help})" in text, (command, d.spelling)
        for p in POLICY_NAMES.values():
            assert p.spelling in text, (command, p.spelling)
        for name, m in MODES.items():
            assert f"{name} ({m.help})" in text, (command, name)
        # each default shown by click, from the modes' table
        assert "[default: (auto (ar fixed:0, split placement))]" in text
        assert "[default: (the mode's: ar none, spec draft, self-spec exit:K" in text
        assert "[default: off]" in text  # --trees
    serve = _help("serve")  # the OpenAI endpoints: local modes and policies only
    assert "channel-aware" not in serve and "placement" not in serve
    assert "[default: (auto (ar fixed:0))]" in serve and "split (" not in serve


def test_a_drafter_added_to_the_table_is_in_the_help():
    from dataclasses import replace

    from edgespec.cli.common import drafter_help
    from edgespec.runtime import names

    row = replace(names.DRAFTER_NAMES["draft"], spelling="feature", help="a feature head")
    table = {**names.DRAFTER_NAMES, "feature": row}
    original, names.DRAFTER_NAMES = names.DRAFTER_NAMES, table
    try:
        assert "feature (a feature head)" in drafter_help()
        assert names.drafter_name("feature") is row
    finally:
        names.DRAFTER_NAMES = original


def test_calibrate_stores_round_costs_that_seed_the_auto_policy(spec_bundles, tmp_path):
    import json
    import shutil

    import edgespec
    from edgespec.runtime.calibrate import device_key

    b = tmp_path / "b"
    shutil.copytree(spec_bundles["gpt2"], b)
    r = CliRunner().invoke(main, ["bench", str(b), "--calibrate", "--threads", "1"])
    assert r.exit_code == 0, r.output
    entry = json.loads((b / "calibration.json").read_text())[device_key("cpu", 1)]
    assert set(entry) == {"spec", "self-spec@1", "self-spec@2", "self-spec@3", "lookup", "suffix"}
    assert len(entry["suffix"]["round_seconds"]) == 9 and entry["suffix"]["tokens_per_round"]
    assert len(entry["spec"]["round_seconds"]) == 9 and entry["spec"]["draft_token_seconds"] > 0
    tokens = [entry["spec"]["tokens_per_round"][str(g)] for g in (1, 2, 3, 4)]
    assert 1.0 <= tokens[0] <= 2.0 and tokens == sorted(tokens) and tokens[-1] <= 5.0
    model = edgespec.load(b, mode="spec", threads=1)
    assert model.policy.cost.round_time[0] == entry["spec"]["round_seconds"]["0"]
    assert edgespec.load(b, mode="spec", threads=2).policy.cost.round_time == {}  # other device
    # a chain: each member's policy starts from its own entry (prompt lookup's from "lookup")
    chain = edgespec.load(b, mode="spec", drafter="lookup+draft", threads=1).policy
    assert chain.main.cost.round_time[0] == entry["spec"]["round_seconds"]["0"]
    assert chain.apart["lookup"].cost.round_time[1] == entry["lookup"]["round_seconds"]["1"]
    # seeding prices, not how acceptance is learnt: prompt lookup keeps its own state prior
    from edgespec.runtime.policies.estimates import PRIORS

    assert chain.apart["lookup"].cost.acceptance.priors.state_prior == PRIORS.state_prior_first
    assert chain.main.cost.acceptance.priors.state_prior == PRIORS.state_prior


def test_bench_compares_modes_and_checks_outputs(spec_bundles):
    r = CliRunner().invoke(main, ["bench", str(spec_bundles["qwen2"]), "-n", "8"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == [
        "ar",
        "spec",
        "self-spec@1",
        "self-spec@2",
        "self-spec@3",
        "lookup",
        "suffix",
        "default",
    ]
    assert all(ln.endswith("True") for ln in lines[1:])


HEAVY_BLOCKED = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'numpy', 'onnxruntime', 'torch', 'transformers'}:
            raise ImportError(f'{name} is blocked in this test')
sys.meta_path.insert(0, Block())
from edgespec.cli import main
main()
"""


def test_help_and_bad_flags_are_answered_without_loading_numpy_or_onnxruntime(tmp_path):
    """`edgespec --help`, every command's --help and a bad flag never import the runtime (any
    import of numpy or onnxruntime raises in this process)."""
    import subprocess
    import sys

    from edgespec.cli import COMMANDS

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", HEAVY_BLOCKED, *args], capture_output=True, text=True
        )

    top = run("--help")
    assert top.returncode == 0, top.stderr
    assert all(name in top.stdout for name in COMMANDS)
    for name in COMMANDS:
        r = run(name, "--help")
        assert r.returncode == 0 and "Usage:" in r.stdout, (name, r.stderr)
    bad = run("generate", str(tmp_path), "-p", "hi", "--mode", "nonsense")
    assert bad.returncode == 2 and "'nonsense' is not one of" in bad.stderr, bad.stderr
    assert "blocked" not in bad.stderr
    unknown = run("generate", str(tmp_path), "--no-such-flag")
    assert unknown.returncode == 2 and "No such option" in unknown.stderr, unknown.stderr
    assert run("nonsense").returncode == 2


def test_edgespec_errors_are_one_line_without_loading_the_runtime(tmp_path):
    """The CLI names its errors by `EdgespecError` (a leaf), not by importing onnxruntime:
    a missing bundle is one `Error:` line even where numpy and onnxruntime cannot load."""
    import subprocess
    import sys

    missing = str(tmp_path / "missing")
    r = subprocess.run(
        [sys.executable, "-c", HEAVY_BLOCKED, "inspect", missing], capture_output=True, text=True
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("Error: bundle folder") and "Traceback" not in r.stderr
