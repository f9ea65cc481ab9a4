"""The JavaScript package in a real browser: the demo page (`js/examples/web/`) on
onnxruntime-web (wasm) in headless Chromium gives the Python runtime's greedy tokens.

The test builds the package and the page (`npm run build:web`: one ES module with
onnxruntime-web, and its wasm binary beside it), exports a tiny chat bundle for onnxruntime's
JavaScript packages (`batched_verify=False`), serves page and bundle from
`js/examples/web/serve.mjs` on loopback, and has `js/examples/web/check.mjs` (Playwright driving
Debian's `chromium`) open the page once per mode on wasm: spec, self-spec, and split (the page
drafts, a real `edgespec serve` on loopback verifies; no token: a browser's WebSocket cannot
send one). One more page picks its own backend (WebGPU where Chromium gives an adapter: here
SwiftShader's, a CPU WebGPU, so few tokens). Each page generates with `ar` and then with its
mode, streaming; every run's tokens must equal `Model.generate`'s, and the tokens must have
come in more than one chunk. A bundle with a feature head (a tiny GGUF through `edgespec
distill`, its `eagle` graph reading a second weights file of its own) gets a page of its own:
`eagle` and `lookup+eagle` on wasm, each giving the Python runtime's tokens. It skips when node
or chromium is missing, saying how to install them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import write_chat_checkpoint  # noqa: E402
from split_server import start_server  # noqa: E402
from test_js_conformance import JS, NODE, build_js, distilled_bundle  # noqa: E402

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed (Node >= 20 runs js/)"),
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed: `apt-get install -y chromium` (Debian's package; "
        "Playwright drives it, no browser download)",
    ),
]
WEB = JS / "examples" / "web"
PROMPT = "def parse(x):\n    return"
MAX_NEW = 40
MODES = [("spec", "fixed:4", None), ("self-spec", "fixed:3", 2), ("split", "fixed:4", None)]
WEBGPU_NEW = 4  # a software WebGPU adapter (SwiftShader) runs ~2 tokens per second


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("js_browser")
    target = write_chat_checkpoint(root / "t", seed=0)
    draft = write_chat_checkpoint(root / "d", seed=1)
    export_bundle(target, root / "b", draft=draft, exit_layers=[2], batched_verify=False)
    return root / "b"


def build_web() -> None:
    build_js()
    npm = shutil.which("npm")
    subprocess.run([npm, "run", "build:web"], cwd=JS, check=True, timeout=300, capture_output=True)


@pytest.fixture(scope="module")
def web_built() -> None:
    build_web()


@pytest.fixture(scope="module")
def served(bundle, web_built):
    yield from serve(bundle)


def serve(bundle: Path):
    server = subprocess.Popen(
        [NODE, str(WEB / "serve.mjs"), "--bundle", str(bundle), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()  # "serving http://127.0.0.1:PORT/ ..."
        assert line.startswith("serving http://127.0.0.1:"), line
        yield line.split()[1]
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def pages(served, bundle, tmp_path_factory) -> list[dict]:
    server = start_server(bundle, tmp_path_factory.mktemp("split"), None)
    try:
        return open_pages(served, server.url, tmp_path_factory)
    finally:
        server.stop()


def check_pages(urls: list[str], shot: Path, timeout: int = 120) -> list[dict]:
    """Each URL's page result; `timeout`: seconds a page may take (several: page-N.png)."""
    run = subprocess.run(
        [NODE, str(WEB / "check.mjs"), *urls, "--chromium", CHROMIUM, "--screenshot", str(shot),
         "--timeout", str(timeout)],
        capture_output=True,
        text=True,
        timeout=len(urls) * timeout + 180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(urls), run.stdout[-3000:]
    return results


def open_pages(served: str, split_server: str, tmp_path_factory) -> list[dict]:
    urls = [
        served + "?" + urlencode(dict(mode=mode, policy=policy, prompt=PROMPT, max=MAX_NEW,
                                      run=1, ignoreEos=1, provider="wasm", server=split_server))
        for mode, policy, _ in MODES
    ]  # fmt: skip
    # no provider: the page asks navigator.gpu for an adapter and says what it found
    urls.append(served + "?" + urlencode(dict(mode="spec", policy="fixed:4", prompt=PROMPT,
                                              max=WEBGPU_NEW, run=1, ignoreEos=1)))  # fmt: skip
    return check_pages(urls, tmp_path_factory.mktemp("shots") / "page.png")


def python_tokens(
    bundle: Path, mode: str, policy: str | None, exit_layer: int | None, drafter: str | None = None
) -> list:
    from edgespec.runtime.model import Model

    options = {"draft_policy": policy} if policy else {}
    if drafter:
        options["drafter"] = drafter
    model = Model.load(bundle, mode=mode, exit_layer=exit_layer, **options)
    return model.generate(PROMPT, max_new_tokens=MAX_NEW, ignore_eos=True).tokens


def test_the_page_streams_the_python_runtimes_greedy_tokens_on_wasm(pages, bundle):
    ar = python_tokens(bundle, "ar", None, None)
    assert len(ar) == MAX_NEW
    for (mode, policy, exit_layer), page in zip(MODES, pages[:-1], strict=True):
        assert "error" not in page, page
        assert page["backend"]["provider"] == "wasm"
        assert page["crossOriginIsolated"] is True  # the server's headers: wasm threads allowed
        first, second = page["runs"]
        assert (first["mode"], second["mode"], second["policy"]) == ("ar", mode, policy)
        assert first["tokens"] == ar, "ar in the browser"
        if mode != "split":  # split: the server's target, so ar's tokens (just above)
            assert second["tokens"] == python_tokens(bundle, mode, policy, exit_layer), mode
        assert second["tokens"] == ar, mode
        for run in (first, second):
            assert sum(run["chunks"]) == MAX_NEW and len(run["chunks"]) > 1  # streamed
        assert page["status"] == "done: the same tokens as ar"


def test_the_page_says_which_backend_it_runs_on(pages):
    for page in pages[:-1]:
        assert page["backendLine"].startswith("asked for wasm (onnxruntime-web 1.30.0")
    line = pages[-1]["backendLine"]
    found = ("WebGPU adapter: ", "WebGPU gave no adapter", "WebGPU is not offered")
    assert line.startswith(found), line
    assert "(onnxruntime-web 1.30.0" in line


def test_the_page_on_the_backend_it_picks_gives_the_same_tokens(pages, bundle):
    """WebGPU where Chromium offers an adapter (the KV cache goes in at its exact length and
    comes back concatenated: onnxruntime-web's WebGPU attention), else wasm with the reason."""
    page = pages[-1]
    assert "error" not in page, page
    ar = python_tokens(bundle, "ar", None, None)[:WEBGPU_NEW]  # greedy: a prefix of 40 tokens
    assert [r["tokens"] for r in page["runs"]] == [ar, ar]
    print("backend picked by the page:", page["backendLine"])


EAGLE_PAGES = [("eagle", "fixed:3", None), ("eagle", "fixed:4", "lookup+eagle")]


@pytest.fixture(scope="module")
def eagle_bundle(tmp_path_factory) -> Path:
    pytest.importorskip("torch", reason="edgespec distill trains with torch (the distill extra)")
    pytest.importorskip("gguf", reason="the tiny GGUF is written with the gguf package")
    # float blocks: onnxruntime-web's wasm MatMulNBits multiplies float activations where the
    # native kernels quantize them to int8 (tests/test_js_wasm_matmulnbits.py; a Q4_1 file's
    # greedy tokens part from Python's after ~20, ar as much as eagle), so only a float file's
    # tokens can be compared with Python's (tests/test_js_browser_gguf.py: Q4_1 blocks)
    return distilled_bundle(tmp_path_factory.mktemp("js_browser_eagle"), "F32")


@pytest.fixture(scope="module")
def eagle_pages(eagle_bundle, web_built, tmp_path_factory) -> list[dict]:
    for base in serve(eagle_bundle):
        query = dict(prompt=PROMPT, max=MAX_NEW, run=1, ignoreEos=1, provider="wasm")
        urls = [
            base + "?" + urlencode(dict(mode=mode, policy=policy, **query, drafter=d or ""))
            for mode, policy, d in EAGLE_PAGES
        ]
        return check_pages(urls, tmp_path_factory.mktemp("shots") / "eagle.png")
    raise AssertionError("the page server did not start")


def test_the_page_drafts_with_a_feature_head_as_python_does(eagle_pages, eagle_bundle):
    """The head's graph takes its own weights file besides the bundle's: both are fetched and
    handed to onnxruntime-web as external data; its output is the Python runtime's."""
    ar = python_tokens(eagle_bundle, "ar", None, None)
    for (mode, policy, drafter), page in zip(EAGLE_PAGES, eagle_pages, strict=True):
        assert "error" not in page, page
        first, second = page["runs"]
        assert first["tokens"] == ar, "ar in the browser"
        assert second["tokens"] == python_tokens(eagle_bundle, mode, policy, None, drafter)
        assert second["tokens"] == ar and page["status"] == "done: the same tokens as ar"
        assert len(second["chunks"]) > 1
