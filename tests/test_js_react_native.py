"""The React Native example (`js/examples/react-native/`): an app screen over
onnxruntime-react-native that type-checks against that package's and React Native's own types
(`tsc`, strict) and bundles (esbuild; the native modules stay imports for the app's Metro).

Nothing here runs it on a phone: this checks that the package's API fits
onnxruntime-react-native's and that the package bundles for an app. The example's own
dependencies (React Native's types among them) are installed by `npm ci` in its folder when
missing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_js_conformance import JS, NODE, build_js  # noqa: E402

APP = JS / "examples" / "react-native"
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (Node >= 20 runs js/)")


def npm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("npm") or "npm", *args], cwd=APP, capture_output=True, text=True, timeout=600
    )


def test_the_react_native_example_type_checks_and_bundles():
    build_js()  # the example depends on the package's build (file:../..)
    if not (APP / "node_modules").exists():
        run = npm("ci", "--ignore-scripts", "--no-audit", "--no-fund")
        assert run.returncode == 0, run.stderr[-3000:]
    run = npm("run", "check")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run = npm("run", "bundle")
    assert run.returncode == 0, run.stderr[-3000:]
    app = (APP / "dist" / "app.js").read_text()
    assert 'from "onnxruntime-react-native"' in app  # left to the app's bundler
    assert "async function loadModel(" in app and "Tokenizer" in app  # the package inside
