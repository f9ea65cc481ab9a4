"""`edgespec chat` in a real pseudo-terminal: streamed replies, /stats, /reset, Ctrl-D."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pexpect
import pytest

import edgespec
from edgespec.runtime.chat.session import ChatOptions

ROOT = Path(__file__).resolve().parents[1]


def spawn(*args: str) -> pexpect.spawn:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return pexpect.spawn(
        sys.executable,
        ["-m", "edgespec.cli", "chat", *args],
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 200),
    )


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_terminal_chat_streams_the_same_replies_and_reports_stats(chat_bundle, mode):
    options = ChatOptions(max_new_tokens=8, temperature=0)
    session = edgespec.load(chat_bundle).chat_session(system="Be brief.")
    want = ["".join(c.text for c in session.say(t, options)) for t in ("hello", "and more")]
    child = spawn(str(chat_bundle), "--system", "Be brief.", "-n", "8", "-t", "0",
                  "--mode", mode)  # fmt: skip
    child.expect_exact(">>> ")
    for text, reply in zip(("hello", "and more"), want, strict=True):
        child.sendline(text)
        child.expect_exact(text + "\r\n")  # the terminal's echo of the line typed
        child.expect_exact(">>> ")
        assert child.before.replace("\r\n", "\n").rstrip("\n") == reply.replace("\r\n", "\n")
    child.sendline("/stats")
    child.expect(r"last reply: \d+ tokens .* tok/s decoding, first token after \d+ ms")
    child.expect(r"prompt (\d+) tokens, (\d+) cached")
    assert int(child.match.group(2)) > 0  # the second turn reused the first's cache
    child.expect("speculation: ")
    child.expect_exact(">>> ")
    child.sendline("/reset")
    child.expect_exact("(new conversation)")
    child.expect_exact(">>> ")
    child.sendline("hello")
    child.expect_exact("hello\r\n")
    child.expect_exact(">>> ")
    assert child.before.replace("\r\n", "\n").rstrip("\n") == want[0].replace("\r\n", "\n")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_terminal_chat_on_a_bundle_without_a_template_is_one_clear_line(bundles):
    child = spawn(str(bundles["qwen2"]))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus != 0
    assert "has no chat template" in child.before
    assert "Traceback" not in child.before
