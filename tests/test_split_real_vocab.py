"""Sampled split decoding at a real vocabulary (Qwen2.5's 151,936 ids): a tiny random Llama
and a 1-layer draft, a real server on loopback. Every round fits the server's request limit
(the device learns it from the server's answers and caps γ), drafted tokens cost their
support, not the vocabulary, and `generate --stats` reports bytes up and tokens drafted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from split_server import TOKEN, start_server

import edgespec
from edgespec import protocol as P
from edgespec.cli import main
from edgespec.runtime.draft_q import DraftSupport

VOCAB = 151_936
FRAMING = 14  # WebSocket frame header + mask of a message over 64 KiB, client to server


@pytest.fixture(scope="module")
def big_vocab_bundle(tmp_path_factory) -> Path:
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("big_vocab")
    dims = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    target = write_checkpoint(
        root / "t", "llama", seed=1, vocab_size=VOCAB, num_hidden_layers=2, **dims
    )
    draft = write_checkpoint(
        root / "d", "llama", seed=2, vocab_size=VOCAB, num_hidden_layers=1, **dims
    )
    export_bundle(target, root / "b", draft=draft, verify=False)
    return root / "b"


@pytest.mark.parametrize(
    "policy, support, limit",
    [
        (None, DraftSupport(), 1 << 20),  # the defaults: channel-aware, top-128 supports
        ("fixed:4", DraftSupport(top_k=0), 500_000),  # uncapped supports: ~390 KB a row
    ],
)
def test_every_sampled_round_fits_the_server_limit(
    big_vocab_bundle, tmp_path, policy, support, limit
):
    server = start_server(big_vocab_bundle, tmp_path, TOKEN, "--max-request-bytes", str(limit))
    try:
        model = edgespec.load(
            big_vocab_bundle,
            mode="split",
            server=server.url,
            token=TOKEN,
            drafter="draft",
            draft_policy=policy,
            draft_support=support,
            threads=1,
            local_fallback=False,  # a refused round would raise, not continue locally
        )
        chunks = list(
            model.stream([5, 6, 7], max_new_tokens=12, temperature=0.8, seed=1, ignore_eos=True)
        )
    finally:
        server.stop()
    rounds = [c.stats for c in chunks if c.stats.phase == "decode"]
    assert sum(len(c.tokens) for c in chunks) == 12
    # the default (placement) may also have the server stream: rounds with no drafts
    assert all(r.verifier in ("remote", "stream") for r in rounds)
    assert sum(r.drafted for r in rounds) > 0
    assert all(r.bytes_up - FRAMING <= limit for r in rounds)
    # uncapped supports: fixed:4 is cut to the 1 draft a 500 KB request holds
    assert max(r.drafted for r in rounds) <= P.max_drafts(limit, support.max_ids(VOCAB))
    per_draft = [(r.bytes_up - 35) / r.drafted for r in rounds if r.drafted]
    if support.top_k:
        assert max(per_draft) <= 4 + 5 + 6 * support.top_k  # id + row header + support


def test_generate_stats_report_bytes_up_and_drafts(big_vocab_bundle, tmp_path):
    server = start_server(big_vocab_bundle, tmp_path)
    (tmp_path / "tok").write_text(TOKEN)
    try:
        r = CliRunner().invoke(
            main,
            [
                "generate", str(big_vocab_bundle), "-p", "def f(x):", "-n", "10",
                "--mode", "split", "--server", server.url, "--token-file", str(tmp_path / "tok"),
                "--drafter", "draft", "-t", "0.8", "--seed", "3", "--stats", "--ignore-eos",
                "--draft-policy", "fixed:3",
            ],
        )  # fmt: skip
    finally:
        server.stop()
    assert r.exit_code == 0, r.output
    up = re.search(r"(\d+) B up", r.output)
    drafted = re.search(r"drafted (\d+)", r.output)
    assert up and drafted and int(drafted.group(1)) > 0
    assert int(up.group(1)) / int(drafted.group(1)) < 2048  # ≤ 2 KiB a drafted token
