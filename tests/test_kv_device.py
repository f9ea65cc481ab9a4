"""A KV cache held in an onnxruntime device buffer (how it lives on a GPU) decodes exactly as
one in host memory. The device path is device-agnostic OrtValue code, so onnxruntime's "cpu"
device runs it here; tests/test_cuda.py runs it on CUDA where a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest

import edgespec
from edgespec.runtime.graphs.kv_cache import KVCache

CONFIGS = [
    ("ar", {}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("self-spec", {"exit_layer": 2, "draft_policy": "fixed:3"}),
    ("spec", {"drafter": "lookup+draft", "draft_policy": "auto"}),
]
IDS = [f"{m}-{i}" for i, (m, _) in enumerate(CONFIGS)]


@pytest.mark.parametrize("mode,options", CONFIGS, ids=IDS)
def test_a_cache_in_device_buffers_decodes_the_same_tokens_as_one_in_host_memory(
    spec_bundles, mode, options
):
    bundle = spec_bundles["llama-gqa-tied"]
    prompt = "def f(x):\n    return"
    host = edgespec.load(bundle, mode=mode, **options)
    device = edgespec.load(bundle, mode=mode, **options)
    for session in device.graphs.opened.values():
        session.kv_device = ("cpu", 0)  # OrtValues allocated by onnxruntime, no numpy views
    want = host.generate(prompt, max_new_tokens=24, ignore_eos=True).tokens
    got = device.generate(prompt, max_new_tokens=24, ignore_eos=True).tokens
    assert got == want
    used = [s._bound_cache for s in device.graphs.opened.values() if s._bound_cache]
    assert used and all(c.device == ("cpu", 0) and not c.keys for c in used)


def test_a_device_cache_grows_keeping_its_valid_positions_and_zeroing_the_rest():
    cache = KVCache.allocate([0, 3], kv_heads=2, head_dim=4, capacity=6, dtype=np.float16,
                             device=("cpu", 0))  # fmt: skip
    rng = np.random.default_rng(0)
    written = {}
    for name, value in cache.bound.items():
        written[name] = rng.standard_normal(cache.shape).astype(np.float16)
        value.update_inplace(written[name])
    cache.length = 4
    grown = cache.grown(16)
    assert grown.capacity == 16 and grown.length == 4 and grown.device == ("cpu", 0)
    for name, value in grown.bound.items():
        got = value.numpy()
        assert got.shape == (1, 2, 16, 4) and got.dtype == np.float16
        np.testing.assert_array_equal(got[:, :, :4], written[name][:, :, :4])
        assert not got[:, :, 4:].any()


@pytest.mark.parametrize("mode,options", CONFIGS, ids=IDS)
def test_inputs_bound_again_each_call_decode_the_same_tokens(spec_bundles, mode, options):
    """What a session on a GPU does: onnxruntime copies a bound host input at bind time, so
    the scalars and a host-memory cache are bound again before each call."""
    bundle = spec_bundles["llama-gqa-tied"]
    prompt = "def f(x):\n    return"
    want = edgespec.load(bundle, mode=mode, **options).generate(
        prompt, max_new_tokens=24, ignore_eos=True
    )
    model = edgespec.load(bundle, mode=mode, **options)
    for session in model.graphs.opened.values():
        session._rebind = True
    got = model.generate(prompt, max_new_tokens=24, ignore_eos=True)
    assert got.tokens == want.tokens
