"""Generation in Node leaves the app's event loop free, and an AbortSignal stops it in a round.

onnxruntime-node (1.30) runs a graph synchronously inside a `setImmediate` callback, so a model
on the app's thread holds the event loop for a whole step; `load()` runs the model in a worker
thread (`js/src/threaded.ts`). `js/event_loop.mjs` runs a 10 ms interval timer through one `ar`
generation with a long prefill (4,000 prompt ids on a tiny model with a 4,096 context: one
graph call that takes a while on any CPU), first with the model on the app's thread, then in a
worker. The checks count ticks, never time: a blocked loop runs timers at most once per loop
iteration, and each graph call is one iteration (the `setImmediate`), so it gets at most one
tick per call (chunk, in `ar`) plus the iterations around the generation; the worker gets a
tick per 10 ms of the whole generation. Then an AbortSignal fired by a timer during the prefill:
the stream ends with AbortError before any chunk is read, the worker finished no round but the
one in flight, and the model generates as before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import write_chat_checkpoint  # noqa: E402
from test_js_conformance import JS, NODE, build_js  # noqa: E402

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (Node >= 20 runs js/)")

PROMPT, NEW = 4000, 3


@pytest.fixture(scope="module")
def event_loop(tmp_path_factory) -> dict:
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("js_event_loop")
    target = write_chat_checkpoint(root / "t", seed=0, max_position_embeddings=PROMPT + 96)
    export_bundle(target, root / "b", batched_verify=False)
    build_js()
    out = root / "out.json"
    run = subprocess.run(
        [NODE, str(JS / "event_loop.mjs"), str(root / "b"), str(out), str(PROMPT), str(NEW)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"node failed:\n{run.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_a_worker_model_leaves_the_event_loop_free(event_loop):
    main, worker = event_loop["runs"]
    assert main["thread"] == "main" and worker["thread"] == "worker"
    assert main["chunks"] == worker["chunks"] == NEW
    assert worker["tokens"] == main["tokens"]  # the same generation either way
    # the premise: on the app's thread each graph call blocks the loop for the whole call
    # (if this fails, the installed onnxruntime-node's `run` became asynchronous)
    assert main["ticks"] <= main["chunks"] + 2, main
    # in a worker the timer keeps firing through the calls: well above the blocked bound
    assert worker["ticks"] >= 2 * (worker["chunks"] + 2), worker


def test_an_abort_signal_stops_a_worker_model_within_a_round(event_loop):
    abort = event_loop["abort"]
    assert abort["error"] == "AbortError"
    assert abort["read"] == 0  # fired during the prefill: no chunk reached the app
    assert abort["roundsAfterAbort"] <= 1  # only the round in flight finished
    assert abort["same"]  # and the model generates again exactly as before
