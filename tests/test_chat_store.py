"""Conversations that survive a restart: a saved `ChatSession`, loaded by a fresh model,
answers the next turn with the same tokens as the session that never stopped, prefilling only
the new tokens; files of another bundle, mode or format are refused by name; a failed write
leaves the old file whole."""

from __future__ import annotations

import os

import numpy as np
import pytest

import edgespec
from edgespec.runtime.chat import store as chat_store
from edgespec.runtime.chat.session import ChatOptions
from edgespec.runtime.errors import InputError

TURNS = ["Write a function that adds two numbers.", "Now make it add three.", "Thanks!"]


def converse(session, turns, n=12):
    messages, replies = [], []
    for text in turns:
        messages.append({"role": "user", "content": text})
        reply = session.reply(messages, ChatOptions(max_new_tokens=n, temperature=0))
        messages.append({"role": "assistant", "content": reply.text})
        replies.append(reply)
    return messages, replies


@pytest.mark.parametrize("mode", ["ar", "spec", "lookup"])
def test_a_loaded_conversation_continues_as_if_never_stopped(chat_bundle, tmp_path, mode):
    live = edgespec.load(chat_bundle, mode=mode).chat_session()
    messages, _ = converse(live, TURNS[:2])
    path = tmp_path / "conversation.npz"
    live.save(path)
    nxt = [*messages, {"role": "user", "content": TURNS[2]}]
    options = ChatOptions(max_new_tokens=12, temperature=0)
    want = live.reply(nxt, options)

    restarted = edgespec.load(chat_bundle, mode=mode).chat_session()
    restarted.load(path)
    assert restarted.messages == live.messages[: len(restarted.messages)]
    got = restarted.reply(nxt, options)
    assert got.tokens == want.tokens
    assert got.cached_tokens == want.cached_tokens > 0  # only the new turn was prefilled
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left


def test_another_bundle_mode_or_format_is_refused_by_name(chat_bundle, spec_bundles, tmp_path):
    session = edgespec.load(chat_bundle, mode="spec").chat_session()
    converse(session, TURNS[:1])
    path = tmp_path / "c.npz"
    session.save(path)
    with pytest.raises(InputError, match="mode it was saved with"):
        edgespec.load(chat_bundle, mode="ar").chat_session().load(path)
    other = edgespec.load(spec_bundles["qwen2"], mode="spec")
    with pytest.raises(InputError, match="another bundle"):
        other.chat_session().load(path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["meta"] = np.frombuffer(
        bytes(arrays["meta"]).replace(b'"version": 1', b'"version": 99'), np.uint8
    )
    np.savez(tmp_path / "future.npz", **arrays)
    with pytest.raises(InputError, match="version 99"):
        session.load(tmp_path / "future.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a saved conversation"):
        session.load(tmp_path / "junk.npz")


def test_a_bundle_changed_in_place_is_refused(chat_bundle, tmp_path):
    """The identity covers the weights: a copy of the bundle with one weight byte changed."""
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(chat_bundle, copy)
    session = edgespec.load(copy).chat_session()
    converse(session, TURNS[:1], n=4)
    path = tmp_path / "c.npz"
    session.save(path)
    weights = copy / session.manifest.weights_file
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(InputError, match="another bundle"):
        edgespec.load(copy).chat_session().load(path)


def test_a_write_that_fails_leaves_the_old_file_whole(chat_bundle, tmp_path, monkeypatch):
    session = edgespec.load(chat_bundle).chat_session()
    converse(session, TURNS[:1], n=4)
    path = tmp_path / "c.npz"
    session.save(path)
    before = path.read_bytes()
    converse(session, TURNS[:2], n=4)

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr(chat_store.os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        session.save(path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.npz"]
    monkeypatch.undo()
    fresh = edgespec.load(chat_bundle).chat_session()
    fresh.load(path)  # the old file still loads
    assert len(fresh.seq) > 0
