"""Split decoding from the JavaScript package: a Node device against a real `edgespec serve`
on loopback (the WebSocket protocol of `edgespec/protocol.py`, bearer token included).

`js/split_check.mjs` loads a tiny chat bundle in mode "split" (drafting with the bundle's draft
model or with prompt lookup) and generates; its greedy tokens must equal the Python runtime's
`ar`, and its drafts and acceptances the Python split client's on the same server. A chat of
two turns keeps the server's session between them (PAUSE, then START with `keep`): the second
turn's prompt is mostly not sent again, and its tokens equal the Python runtime's chat.
Refusals (no server there, a wrong token) are messages, not stack traces. A server killed
in the middle of a generation: the bundle's own target finishes it, with `ar`'s tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import write_chat_checkpoint  # noqa: E402
from split_server import TOKEN, free_port, start_server  # noqa: E402
from test_js_conformance import JS, NODE, build_js  # noqa: E402

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (Node >= 20 runs js/)")
PROMPT = "def parse(x):\n    return"
MAX_NEW = 32
CHAT = [{"role": "user", "content": "Name a prime."}]


def node_flags() -> list[str]:
    """Node 20 has its WebSocket behind a flag (Node >= 22: always)."""
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout
    major = int(version.strip().lstrip("v").split(".")[0])
    return ["--experimental-websocket"] if major < 22 else []


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("js_split")
    target = write_chat_checkpoint(root / "t", seed=0)
    draft = write_chat_checkpoint(root / "d", seed=1)
    export_bundle(target, root / "b", draft=draft, batched_verify=False)
    return root / "b"


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    build_js()
    s = start_server(bundle, tmp_path_factory.mktemp("server"))
    yield s
    s.stop()


def run_js(bundle: Path, url: str, cases: list[dict], tmp: Path, token: str = TOKEN):
    (tmp / "cases.json").write_text(
        json.dumps(dict(bundle=str(bundle), server=url, token=token, cases=cases))
    )
    return subprocess.run(
        [NODE, *node_flags(), str(JS / "split_check.mjs"), str(tmp / "cases.json"),
         str(tmp / "out.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_js_split_greedy_tokens_equal_ar_and_the_python_split_client(bundle, server, tmp_path):
    from edgespec.runtime.model import Model

    cases = [
        dict(prompt=PROMPT, drafter="draft", policy="fixed:4", max_new_tokens=MAX_NEW),
        dict(prompt=PROMPT, drafter="lookup", policy="fixed:4", max_new_tokens=MAX_NEW),
    ]
    run = run_js(bundle, server.url, cases, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    ar = Model.load(bundle, mode="ar").generate(PROMPT, max_new_tokens=MAX_NEW, ignore_eos=True)
    for case, js in zip(cases, got, strict=True):
        assert js["tokens"] == ar.tokens, case["drafter"]
        py = Model.load(
            bundle, mode="split", server=server.url, token=TOKEN, drafter=case["drafter"],
            draft_policy=case["policy"],
        ).generate(PROMPT, max_new_tokens=MAX_NEW, ignore_eos=True)  # fmt: skip
        assert py.tokens == ar.tokens
        assert (js["drafted"], js["accepted"]) == (py.stats.drafted, py.stats.accepted)
    assert got[0]["drafted"] > 0 and got[1]["accepted"] > 0  # drafts went to the server


def test_js_split_chat_resumes_the_servers_session_between_turns(bundle, server, tmp_path):
    from edgespec.runtime.model import Model

    local = Model.load(bundle, mode="ar")
    first = local.chat(CHAT, max_new_tokens=MAX_NEW)
    turns = [CHAT, CHAT + [{"role": "assistant", "content": first.text},
                           {"role": "user", "content": "Another?"}]]  # fmt: skip
    second = local.chat(turns[1], max_new_tokens=MAX_NEW)
    cases = [dict(turns=turns, drafter="draft", policy="fixed:2", max_new_tokens=MAX_NEW)]
    run = run_js(bundle, server.url, cases, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    (js,) = json.loads((tmp_path / "out.json").read_text())
    assert js["tokens"] == [first.tokens, second.tokens]
    assert js["cached"][0] == 0 and js["cached"][1] > 0  # the server kept the first turn


def cli(bundle: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NODE, *node_flags(), str(JS / "dist" / "cli.js"), "generate", str(bundle), "-p", "hi",
         "--mode", "split", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_js_split_refusals_say_what_to_do(bundle, server, tmp_path):
    run = cli(bundle)
    assert run.returncode == 2 and "split mode needs a server" in run.stderr, run.stderr
    nowhere = f"ws://127.0.0.1:{free_port()}"
    run = cli(bundle, "--server", nowhere)
    assert run.returncode == 2 and "is `edgespec serve` running there?" in run.stderr, run.stderr
    (tmp_path / "token").write_text("wrong-token\n")
    run = cli(bundle, "--server", server.url, "--token-file", str(tmp_path / "token"))
    assert run.returncode == 2 and "refused the token" in run.stderr, run.stderr
    assert "    at " not in run.stderr  # a message, not a stack trace


def test_js_split_finishes_locally_when_the_server_dies_mid_generation(bundle, tmp_path):
    """The server verifies the first round, then is killed (SIGKILL) while the stream waits;
    the rest of the generation is verified by the bundle's `full` graph, and the tokens are
    `ar`'s."""
    from edgespec.runtime.model import Model

    build_js()
    (tmp_path / "server").mkdir()
    server = start_server(bundle, tmp_path / "server")
    case = dict(prompt=PROMPT, drafter="draft", policy="fixed:4", max_new_tokens=MAX_NEW,
                pause_after=2)  # fmt: skip
    (tmp_path / "cases.json").write_text(
        json.dumps(dict(bundle=str(bundle), server=server.url, token=TOKEN, cases=[case]))
    )
    node = subprocess.Popen(
        [NODE, *node_flags(), str(JS / "split_check.mjs"), str(tmp_path / "cases.json"),
         str(tmp_path / "out.json")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert node.stdout.readline() == "paused\n", node.stderr.read()[-3000:]
        server.stop()  # killed between two rounds of the generation
        node.stdin.write("go\n")
        node.stdin.flush()
        _, err = node.communicate(timeout=120)
    finally:
        server.stop()
        if node.poll() is None:
            node.kill()
    assert node.returncode == 0, err[-3000:]
    [js] = json.loads((tmp_path / "out.json").read_text())
    ar = Model.load(bundle, mode="ar").generate(PROMPT, max_new_tokens=MAX_NEW, ignore_eos=True)
    assert js["down"] and "closed the connection" in js["down"]  # it did go on locally
    assert js["chunks"] > 2  # rounds after the server died
    assert js["tokens"] == ar.tokens
