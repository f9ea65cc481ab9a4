"""The server's prefix cache on disk (`edgespec serve B --cache-dir DIR`): a restarted server
process answers the next turn of a conversation prefilling only the tokens past the prefix it
kept, with the tokens a cold server gives; files of another bundle or format version, damaged
and half-written files are ignored by name; the folder stays within its byte budget, least
recently used first, under concurrent writers and readers."""

from __future__ import annotations

import os
import shutil
import signal
import threading

import numpy as np
import openai
import pytest
from split_server import TOKEN, start_server

from edgespec.serve.prefix_cache import Layout, PrefixCache, Snapshot

SYSTEM = (
    "You are a careful assistant for a hardware shop. Answer in short sentences, name the "
    "part and its shelf, and never invent a price. Shelves: A holds screws and nails, B holds "
    "glue and tape, C holds paint, D holds tools, E holds garden things."
)
TURN1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is glue?"}]
CACHE = ("--cache-min-tokens", "16")


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=120)


def ask(server, messages, n=8) -> tuple[str, object]:
    r = client(server).chat.completions.create(
        model="m", messages=messages, max_tokens=n, temperature=0
    )
    return r.choices[0].message.content, r.usage


def stop_gracefully(server) -> None:
    """SIGTERM: the server drains, writes what its cache queued, exits 0."""
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0


def engine(server) -> dict:
    return server.health()["openai"]


@pytest.fixture(scope="module", params=["ar", "spec"])
def conversation(request, chat_bundle, tmp_path_factory):
    """A server with --cache-dir answers turn 1 and stops; then the next turn's messages and
    what a cold server (no cache) answers to them."""
    mode = request.param
    tmp = tmp_path_factory.mktemp(f"prefix-{mode}")
    folder = tmp / "cache"
    args = ("--mode", mode, "--conversations", "2")
    first = start_server(chat_bundle, tmp, TOKEN, *args, "--cache-dir", str(folder), *CACHE)
    try:
        reply, usage1 = ask(first, TURN1)
        assert engine(first)["prefix_cache"]["dir"] == str(folder)
    finally:
        stop_gracefully(first)
    messages = [
        *TURN1,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And paint?"},
    ]
    cold = start_server(chat_bundle, tmp, TOKEN, *args)
    try:
        want, want_usage = ask(cold, messages)
    finally:
        cold.stop()
    return {
        "mode": mode,
        "tmp": tmp,
        "folder": folder,
        "args": args,
        "turn1_tokens": usage1.prompt_tokens + usage1.completion_tokens,
        "messages": messages,
        "want": want,
        "prompt_tokens": want_usage.prompt_tokens,
    }


def test_a_restarted_server_prefills_only_what_follows_the_kept_prefix(conversation, chat_bundle):
    c = conversation
    files = [p for p in os.listdir(c["folder"])]
    assert len(files) == 1 and files[0].endswith(".npz"), files  # written at shutdown at latest
    folder = c["tmp"] / "restart"
    shutil.copytree(c["folder"], folder)
    server = start_server(chat_bundle, c["tmp"], TOKEN, *c["args"], "--cache-dir", str(folder))
    try:
        before = engine(server)
        assert before["prefix_cache"]["entries"] == 1
        got, usage = ask(server, c["messages"])
        after = engine(server)
    finally:
        server.stop()
    assert got == c["want"]  # the tokens of a cold server
    assert usage.prompt_tokens == c["prompt_tokens"]
    cached = usage.prompt_tokens_details.cached_tokens
    # the kept prefix: turn 1's prompt and reply, less what the template renders differently
    # once the reply is a message (its end marker), so at least turn 1's prompt
    assert c["turn1_tokens"] - 4 <= cached < usage.prompt_tokens
    assert after["prefix_cache"]["hits"] == 1
    assert after["prefix_cache"]["positions_restored"] == cached
    # the target processed exactly the prompt tokens past the restored prefix
    assert after["prefilled_positions"] - before["prefilled_positions"] == (
        usage.prompt_tokens - cached
    )
    assert after["cached_positions"] - before["cached_positions"] == cached


def damaged(folder, valid: str) -> dict[str, str]:
    """Beside the valid file: files the server must ignore, and the reason each names."""
    data = (folder / valid).read_bytes()
    with np.load(folder / valid) as z:
        arrays = {k: z[k] for k in z.files}
    meta = bytes(arrays["meta"])

    def with_meta(name: str, old: bytes, new: bytes) -> None:
        assert old in meta
        np.savez(folder / name, **{**arrays, "meta": np.frombuffer(meta.replace(old, new), "u1")})

    with_meta("other-bundle.npz", b'"bundle": "', b'"bundle": "0')
    with_meta("future.npz", b'"version": 1', b'"version": 99')
    (folder / "junk.npz").write_bytes(b"not a zip at all")
    (folder / "cut.npz").write_bytes(data[: len(data) // 2])
    (folder / f".{valid}.tmp123").write_bytes(data[:100])  # a write that never finished
    return {
        "other-bundle.npz": "another bundle",
        "future.npz": "version 99",
        "junk.npz": "unreadable",
        "cut.npz": "unreadable",
    }


def test_foreign_damaged_and_half_written_files_are_ignored_by_name(conversation, chat_bundle):
    c = conversation
    if c["mode"] != "ar":
        pytest.skip("one mode is enough: the files are read before any mode runs")
    folder = c["tmp"] / "damaged"
    shutil.copytree(c["folder"], folder)
    (valid,) = os.listdir(folder)
    reasons = damaged(folder, valid)
    server = start_server(chat_bundle, c["tmp"], TOKEN, *c["args"], "--cache-dir", str(folder))
    try:
        report = engine(server)["prefix_cache"]
        assert report["entries"] == 1 and report["ignored"] == len(reasons)
        for name, why in reasons.items():
            assert why in report["ignored_files"][name]
        got, usage = ask(server, c["messages"])
        assert got == c["want"] and usage.prompt_tokens_details.cached_tokens > 0
    finally:
        server.stop()
    for name in reasons:  # never deleted: another server may read them
        assert (folder / name).exists()


def test_a_file_whose_data_fails_its_checksum_is_ignored_and_the_reply_is_cold(
    conversation, chat_bundle
):
    c = conversation
    if c["mode"] != "ar":
        pytest.skip("one mode is enough")
    folder = c["tmp"] / "flipped"
    shutil.copytree(c["folder"], folder)
    (valid,) = os.listdir(folder)
    data = bytearray((folder / valid).read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside a KV array: the meta still reads
    (folder / valid).write_bytes(bytes(data))
    server = start_server(chat_bundle, c["tmp"], TOKEN, *c["args"], "--cache-dir", str(folder))
    try:
        assert engine(server)["prefix_cache"]["entries"] == 1
        got, usage = ask(server, c["messages"])
        report = engine(server)["prefix_cache"]
    finally:
        server.stop()
    assert got == c["want"] and usage.prompt_tokens_details.cached_tokens == 0
    assert report["hits"] == 0 and valid in report["ignored_files"]
    assert "CRC" in report["ignored_files"][valid]


# -- the folder on its own: budget, LRU, replacement, concurrency -----------------------------
LAYOUT = {"target": Layout(2, 2, 4, "float32")}


def snap(tokens: list[int]) -> Snapshot:
    rng = np.random.default_rng(len(tokens) * 7 + tokens[0])
    n = len(tokens)
    layers = [
        (rng.standard_normal((2, n, 4), np.float32), rng.standard_normal((2, n, 4), np.float32))
        for _ in range(2)
    ]
    return Snapshot(list(tokens), {"target": layers})


def open_cache(folder, budget=1 << 20) -> PrefixCache:
    return PrefixCache(folder, budget, "bundle-a", LAYOUT, min_tokens=4)


def test_the_folder_keeps_its_budget_least_recently_used_first(tmp_path):
    cache = open_cache(tmp_path)
    a, b, c = ([i] * 40 for i in (1, 2, 3))
    cache.store(snap(a))
    cache.flush()
    size = cache.report()["bytes"]
    cache.close()
    cache = open_cache(tmp_path, budget=2 * size + size // 2)  # room for two files
    cache.store(snap(b))
    cache.flush()
    assert cache.lookup([*a, 9], 0) is not None  # a was used after b was written
    cache.store(snap(c))
    cache.flush()
    r = cache.report()
    assert r["entries"] == 2 and r["evictions"] == 1 and r["bytes"] <= r["budget"]
    assert cache.lookup([*b, 9], 0) is None  # b was the least recently used
    hit = cache.lookup([*a, 9], 0)
    assert hit is not None and hit.length == 40
    np.testing.assert_array_equal(hit.arrays["target"][1][0], snap(a).arrays["target"][1][0])
    cache.close()
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("*.npz"))
    assert on_disk == r["bytes"]
    big = open_cache(tmp_path, budget=size // 2)  # a smaller budget at a restart evicts
    assert big.report()["bytes"] <= size // 2
    big.store(snap([5] * 40))  # alone over the budget: not written
    big.close()
    assert big.report()["too_large"] == 1


def test_a_longer_prefix_replaces_its_own_beginning_and_other_bundles_files_stay(tmp_path):
    cache = open_cache(tmp_path)
    turn1 = list(range(10, 40))
    cache.store(snap(turn1))
    cache.flush()
    assert not cache.wants(turn1[:20])  # held by a longer file
    assert not cache.wants([*turn1, 7, 8])  # fewer than min_tokens past a file it replaces
    assert cache.wants([*turn1, 7, 8, 9, 6])
    cache.store(snap([*turn1, 7, 8, 9, 6]))
    cache.close()
    r = cache.report()
    assert r["entries"] == 1 and r["replaced"] == 1
    other = PrefixCache(tmp_path, 1 << 20, "bundle-b", LAYOUT, min_tokens=4)
    assert other.report()["entries"] == 0 and other.report()["ignored"] == 1
    assert other.lookup([*turn1, 1], 0) is None
    other.store(snap([3] * 30))
    other.close()
    assert len(list(tmp_path.glob("*.npz"))) == 2  # each bundle's own


def test_concurrent_writers_and_readers_see_whole_files_or_none(tmp_path):
    cache = open_cache(tmp_path, budget=40_000)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                tokens = [int(t) for t in rng.integers(0, 4, 24)]
                if rng.random() < 0.5:
                    cache.store(snap(tokens))
                hit = cache.lookup([*tokens, 99], 0)
                if hit is not None:  # whatever file it found, it is that file's exact data
                    want = snap(hit.tokens).arrays["target"][0][0]
                    np.testing.assert_array_equal(hit.arrays["target"][0][0], want)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    cache.close()
    r = cache.report()
    assert not errors, errors
    assert r["ignored"] == 0 and r["write_errors"] == 0 and r["bytes"] <= 40_000
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left


def test_an_unwritable_cache_dir_is_refused_by_name(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--cache-dir .*cannot write"):
        open_cache(tmp_path / "file" / "sub")


def test_concurrent_requests_on_a_restarted_server_answer_as_a_cold_one(conversation, chat_bundle):
    """Three next turns at once on two conversation slots, each restoring the kept prefix (or
    sharing a slot's): every reply equals the cold server's; the folder ends within budget."""
    c = conversation
    if c["mode"] != "spec":
        pytest.skip("one mode is enough (spec also restores the draft model's cache)")
    follow = ["And paint?", "Where are the hammers?", "Do you sell seeds?"]
    turns = [[*c["messages"][:-1], {"role": "user", "content": f}] for f in follow]
    cold = start_server(chat_bundle, c["tmp"], TOKEN, *c["args"])
    try:
        want = [ask(cold, m)[0] for m in turns]
    finally:
        cold.stop()
    folder = c["tmp"] / "concurrent"
    shutil.copytree(c["folder"], folder)
    server = start_server(chat_bundle, c["tmp"], TOKEN, *c["args"], "--cache-dir", str(folder))
    got: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            got[i] = ask(server, turns[i])
        except BaseException as e:
            errors.append(e)

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(turns))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        report = engine(server)["prefix_cache"]
    finally:
        stop_gracefully(server)
    assert not errors, errors
    assert [got[i][0] for i in range(len(turns))] == want
    # each kept at least turn 1's prompt, from the file or from a slot a reply left
    assert min(got[i][1].prompt_tokens_details.cached_tokens for i in got) >= (
        c["turn1_tokens"] - 4
    )
    assert report["hits"] >= 1 and report["ignored"] == 0
