"""A graph session's narrow calls (decode, draft and verify steps on buffers bound once per
width, `runtime.graphs.session.Narrow`) return what a call on fresh bindings returns, in arrays of
their own."""

from __future__ import annotations

import numpy as np

import edgespec
from edgespec.runtime.graphs.session import NARROW

# (new positions, logits kept): widths and keeps change from call to call, as in speculative
# rounds, and repeat, so that buffers bound earlier are bound again
CALLS = [(1, 1), (1, 1), (4, 4), (2, 1), (4, 4), (1, 0), (6, 6), (1, 1), (NARROW + 2, 1), (3, 3)]


def run_calls(bundle, narrow: bool) -> list[np.ndarray]:
    model = edgespec.load(bundle, mode="ar")
    target = model.verifier.target
    if not narrow:
        for stage in target.stages:
            stage._narrow = None
    rng = np.random.default_rng(0)
    target.reset(128)
    outputs = [target.forward(rng.integers(1, 500, 9), keep=1)]
    for width, keep in CALLS:
        outputs.append(target.forward(rng.integers(1, 500, width), keep=keep))
    return outputs


def test_narrow_calls_return_their_own_arrays_equal_to_fresh_bindings(bundles):
    bundle = bundles["llama-gqa-tied"]
    narrow, fresh = run_calls(bundle, narrow=True), run_calls(bundle, narrow=False)
    assert [o.shape for o in narrow] == [o.shape for o in fresh]
    for a, b in zip(narrow, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    # no call's outputs were overwritten by a later call of the same shape
    again = run_calls(bundle, narrow=True)
    for a, b in zip(narrow, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len({id(o.base if o.base is not None else o) for o in narrow}) == len(narrow)
