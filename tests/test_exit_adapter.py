"""Exit adapters (Kangaroo-style): fitted at export so head@k's exit logits match the final
layer's, stored in head@k, and invisible to verification (self-spec stays lossless)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest

import edgespec
from edgespec.bundle import load_manifest
from edgespec.runtime.graphs.kv_cache import KVCache
from edgespec.runtime.graphs.protocol import Feed
from edgespec.runtime.graphs.session import GraphSession, session_options

EXITS = [1, 2]
N = 24
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text((stdlib / "textwrap.py").read_text()[:8000])  # ~2k tokens
    return path


@pytest.fixture(scope="module")
def adapted(checkpoints, calibration, tmp_path_factory) -> dict[str, Path]:
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("adapted")
    out = {}
    for arch in ("llama-gqa-tied", "gpt2"):
        out[arch] = root / arch
        export_bundle(
            checkpoints[arch],
            out[arch],
            exit_layers=EXITS,
            fit_exit_adapter=calibration,
            adapter_steps=20,
        )
    return out


def _head(bundle: Path, k: int, ids: np.ndarray) -> dict[str, np.ndarray]:
    m = load_manifest(bundle)
    graph = m.graph(f"head@{k}")
    session = GraphSession(
        bundle, graph, m.target, ["CPUExecutionProvider"], session_options(1), np.float32
    )
    t = m.target
    cache = KVCache.allocate(graph.kv_layers, t.num_kv_heads, t.head_dim, 64, np.float32)
    return session.run(cache, 0, Feed(input_ids=ids[None], keep=len(ids)))


@pytest.mark.parametrize("arch", ["llama-gqa-tied", "gpt2"])
def test_fit_brings_exit_logits_closer_to_the_final_layer(adapted, arch):
    records = load_manifest(adapted[arch]).extra["exit_adapters"]
    assert sorted(records) == [str(k) for k in EXITS]
    for r in records.values():
        assert r["kind"] == "rmsnorm+linear" and r["steps"] == 20
        assert r["kl_after"] < r["kl_before"]  # on windows held out from the fit


@pytest.mark.parametrize("arch", ["llama-gqa-tied", "gpt2"])
def test_adapter_changes_exit_logits_but_not_the_hidden_state(adapted, bundles, arch):
    ids = np.arange(3, 19, dtype=np.int64)
    plain, fitted = _head(bundles[arch], 2, ids), _head(adapted[arch], 2, ids)
    np.testing.assert_allclose(fitted["hidden"], plain["hidden"], atol=1e-5)
    assert np.abs(fitted["exit_logits"] - plain["exit_logits"]).max() > 1e-3


@pytest.mark.parametrize("arch", ["llama-gqa-tied", "gpt2"])
def test_self_spec_with_adapters_equals_transformers_greedy(adapted, hf_models, arch):
    import torch

    ar = edgespec.load(adapted[arch], threads=1)
    ids = ar.encode(PROMPT)
    with torch.no_grad():
        ref = (
            hf_models[arch]
            .generate(
                torch.tensor([ids]),
                max_new_tokens=N,
                min_new_tokens=N,
                do_sample=False,
                pad_token_id=0,
            )[0, len(ids) :]
            .tolist()
        )
    assert ar.generate(ids, max_new_tokens=N, ignore_eos=True).tokens == ref
    for k in EXITS:
        model = edgespec.load(
            adapted[arch], mode="self-spec", exit_layer=k, draft_policy="fixed:3", threads=1
        )
        out = model.generate(ids, max_new_tokens=N, ignore_eos=True)
        assert out.tokens == ref and out.stats.drafted > 0


def test_bad_calibration_text_is_explained(checkpoints, tmp_path):
    from edgespec.export import ExportError, export_bundle

    short = tmp_path / "short.txt"
    short.write_text("x = 1\n")
    cases = [
        (dict(exit_layers=[2], fit_exit_adapter=tmp_path / "missing.txt"), "no such file"),
        (dict(exit_layers=[2], fit_exit_adapter=short), "too short"),
        (dict(fit_exit_adapter=short), "also pass --exit-layers"),
    ]
    for options, message in cases:
        with pytest.raises(ExportError, match=message):
            export_bundle(
                checkpoints["llama-gqa-tied"], tmp_path / "b", overwrite=True,
                **options,
            )  # fmt: skip
