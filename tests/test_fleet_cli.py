"""`edgespec serve` stays the light single-process server without --replicas (Ray is never
imported), and the fleet options refuse bad values by name before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from edgespec.cli import main

BLOCK_RAY = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'ray':
            raise ImportError(f'{name} is blocked in this test', name=name)
sys.meta_path.insert(0, Block())
from edgespec.cli import main
main()
"""


def _cli_without_ray(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_RAY, *args], capture_output=True, text=True, timeout=60
    )


def test_plain_serve_never_imports_ray(bundles):
    # a port that is taken makes the plain server exit right after loading the bundle
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        run = _cli_without_ray("serve", str(bundles["llama-gqa-tied"]), "--port", port)
    assert "blocked" not in run.stderr and "fleet" not in run.stderr, run.stderr
    assert "address already in use" in run.stderr.lower() or "errno 98" in run.stderr.lower()


def test_replicas_without_the_fleet_extra_says_what_to_install(bundles):
    run = _cli_without_ray("serve", str(bundles["llama-gqa-tied"]), "--replicas", "2")
    assert run.returncode != 0
    assert "pip install 'edgespec[fleet]'" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["--ray-address", "auto"], "--ray-address deploys a fleet"),
        (["--autoscale", "3:1"], "1 <= MIN <= MAX"),
        (["--autoscale", "two"], "write MIN:MAX"),
        (["--replicas", "0"], "0 is not in the range"),
    ],
)
def test_bad_fleet_options_are_refused_by_name(bundles, args, words):
    if args[0] == "--autoscale":
        pytest.importorskip("ray.serve")
    result = CliRunner().invoke(main, ["serve", str(bundles["llama-gqa-tied"]), *args])
    assert result.exit_code != 0 and words in result.output, result.output
