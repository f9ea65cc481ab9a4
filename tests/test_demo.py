"""`edgespec demo`: the shipped trained model, plain vs speculative, no download, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.demo import MODES, DemoConfig, bundle_path, run_demo
from edgespec.runtime.model import InputError


def test_demo_prints_the_models_text_and_every_mode_gives_the_same_text_as_ar():
    r = CliRunner().invoke(main, ["demo", "-n", "24", "--threads", "1"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line for line in r.output.splitlines() if line.split()[:1]}
    for mode in MODES:
        assert mode in rows, r.output
        assert " yes" in rows[mode], rows[mode]
    assert "<- best" in r.output


def test_demo_modes_reproduce_ar_tokens_and_report_speedups():
    rows = run_demo(DemoConfig(max_new_tokens=32, threads=1, repeats=1))
    assert [r.mode for r in rows] == list(MODES)
    ar = rows[0]
    assert len(ar.tokens) == 32 and ar.text.strip()
    for row in rows:
        assert row.tokens == ar.tokens and row.same_as_ar
        assert row.tokens_per_s > 0 and row.speedup == pytest.approx(
            row.tokens_per_s / ar.tokens_per_s
        )
    # trained drafters get accepted: some mode yields more than one token per target call
    assert max(r.tokens_per_round for r in rows[1:]) > 1.5, [r.tokens_per_round for r in rows]


def test_demo_runs_with_torch_and_transformers_unimportable():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from edgespec.cli import main\n"
        "main(['demo', '-n', '8', '--threads', '1'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "spec+lookup" in proc.stdout


def test_demo_without_its_bundle_names_the_command_that_builds_it(tmp_path):
    with pytest.raises(InputError, match="build_demo_bundle.py"):
        run_demo(DemoConfig(bundle=tmp_path / "nothing"))


def test_demo_refuses_unknown_modes_with_the_known_ones():
    with pytest.raises(InputError, match="spec\\+lookup"):
        DemoConfig(modes=("ar", "beam"))


def test_the_demo_bundle_is_small_enough_to_ship():
    size = sum(p.stat().st_size for p in bundle_path().rglob("*") if p.is_file())
    # "a few tens of MB at most" (issue 17): an fp32 target and an int4 draft, ~45 MiB (see
    # build_demo_bundle.py for why the target is not int8)
    assert 0 < size < 64 * 2**20
