"""A second real execution provider: OpenVINO on the CPU, every decoding mode, same tokens.

onnxruntime-openvino ships its own `onnxruntime` module and conflicts with the plain wheel,
so it lives in its own venv; this test exports bundles here and decodes them there:

    python3 -m venv /work/venvs/ov
    /work/venvs/ov/bin/pip install onnxruntime-openvino numpy click
    EDGESPEC_OV_PYTHON=/work/venvs/ov/bin/python python -m pytest tests/test_openvino.py

(When this process's onnxruntime has the OpenVINO provider itself, it is used directly.)
OpenVINO takes every node but GroupQueryAttention, which onnxruntime keeps on its CPU
provider inside the same session; the test checks that both providers really ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

import edgespec

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 9, 200, 31, 7], [1500, 77, 3, 3, 3, 3, 12], [42]]
NEW_TOKENS = 16


def ov_python() -> str:
    if "OpenVINOExecutionProvider" in ort.get_available_providers():
        return sys.executable
    python = os.environ.get("EDGESPEC_OV_PYTHON")
    if not python:
        pytest.skip(
            "no OpenVINO execution provider: pip install onnxruntime-openvino into its own venv "
            "(it replaces the onnxruntime module) and set EDGESPEC_OV_PYTHON to that venv's python"
        )
    return python


def run_worker(folder: Path, tmp_path: Path) -> dict:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("EDGESPEC_DEVICES", None)
    cmd = [ov_python(), str(ROOT / "tests" / "openvino_worker.py"), str(folder)]
    cmd += [json.dumps(PROMPTS), str(NEW_TOKENS)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "OpenVINOExecutionProvider" in result["providers"], result["providers"]
    return result


def test_every_mode_on_openvino_gives_the_cpu_providers_tokens(spec_bundles, tmp_path):
    folder = spec_bundles["llama-gqa-tied"]
    result = run_worker(folder, tmp_path)
    # this checkout's own onnxruntime (CPU provider) is the reference
    ar = edgespec.load(folder)
    reference = [ar.generate(p, max_new_tokens=NEW_TOKENS, ignore_eos=True).tokens for p in PROMPTS]
    for mode in ("ar", "spec", "self-spec", "lookup"):
        assert result[f"cpu/{mode}"]["tokens"] == reference, mode
        assert result[f"openvino/{mode}"]["tokens"] == reference, mode
    where = result["placement"]
    # OpenVINO ran the graph in subgraphs between the attention nodes; onnxruntime's CPU
    # provider ran the com.microsoft GroupQueryAttention nodes (one per layer)
    assert sum(where["OpenVINOExecutionProvider"].values()) >= 1
    assert where["CPUExecutionProvider"].get("GroupQueryAttention") == 4


def test_qdq_bundle_is_lossless_within_openvino(checkpoints, tmp_path):
    """OpenVINO runs QDQ int8 with its own integer kernels, so its tokens may differ from
    onnxruntime's CPU provider's; every mode must still reproduce OpenVINO's own `ar`."""
    from edgespec.export import export_bundle

    ov_python()  # skip before the export when there is no OpenVINO
    folder = tmp_path / "qdq"
    export_bundle(checkpoints["llama-gqa-tied"], folder, quantize="qdq-int8", exit_layers=[2])
    result = run_worker(folder, tmp_path)
    for device in ("cpu", "openvino"):
        ar = result[f"{device}/ar"]["tokens"]
        for mode in ("self-spec", "lookup"):
            assert result[f"{device}/{mode}"]["tokens"] == ar, (device, mode)
