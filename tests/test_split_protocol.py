"""The split-decoding wire format: round trips, and every malformed message refused by name."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from edgespec import protocol as P
from edgespec.runtime.draft_q import SCALE, DraftSupport, SparseQ, quantize, truncate

LIMITS = P.Limits(vocab_size=100, max_bytes=4096, max_ids=64)


def test_every_message_round_trips():
    q = [quantize(np.arange(100), np.full(100, 0.01)), quantize(np.array([5]), np.ones(1))]
    msgs = [
        P.Start([1, 2, 3], 40, 0.7, 0.9, 5, 1234, "sha256:abc", session=3, round=1),
        P.Start([5], 8),
        P.Start([7, 8], 64, keep=31, session=3, round=2),  # a resumed session
        P.Verify(12, [4, 5], q, round=9),
        P.Verify(12, []),
        P.Result(2, 17, 15, 0.25, 3, 9),
        P.Result(0, 17, 4, 0.5, 3, 1, limits=P.ServerLimits(128, 1 << 20)),
        P.Result(0, 17, 4, 0.5, 3, 1, limits=P.ServerLimits(128, 1 << 20, 42.5, 3)),
        P.Result(0, 17, 4, 0.5, 3, 1, limits=P.ServerLimits(128, 1 << 20, 0.0, 3, 64)),
        P.Verify(12, [4, 5, 6, 7], None, [-1, -1, 1, 2], round=9),  # a token tree
        P.Verify(12, [4, 5], q, [-1, -1], round=9),  # sampled siblings, a q row each
        P.Result(2, 17, 15, 0.25, 3, 9, path=[1, 3]),  # a tree's answer: PATH
        P.Result(0, 17, 13, 0.25, 3, 9, path=[]),
        P.Error(P.TOO_LARGE, "too big é", 3, 9),
        P.End(3, 10),
        P.Pause(3, 11),
    ]
    for msg in msgs:
        back = P.decode(P.encode(msg), LIMITS)
        if isinstance(msg, P.Verify) and msg.q is not None:
            assert back.q is not None
            for a, b in zip(back.q, msg.q, strict=True):  # exactly the q that was sampled
                np.testing.assert_array_equal(a.ids, b.ids)
                np.testing.assert_array_equal(a.counts, b.counts)
            back.q = msg.q
        if isinstance(msg, P.Start):
            assert back.temperature == pytest.approx(msg.temperature)
            assert back.top_p == pytest.approx(msg.top_p)
            back.temperature, back.top_p = msg.temperature, msg.top_p
        if isinstance(msg, P.Result):
            assert back.server_seconds == pytest.approx(msg.server_seconds)
            back.server_seconds = msg.server_seconds
        assert back == msg


def test_a_drafted_token_costs_its_support_not_the_vocabulary():
    """At Qwen2.5's vocabulary a top-64 q row is 6 bytes an id (not 600 KB a dense row);
    `verify_size` predicts every VERIFY's size exactly."""
    rng = np.random.default_rng(0)
    vocab = 151_936
    qs = [truncate(rng.dirichlet(np.ones(vocab) * 0.05), DraftSupport(64)) for _ in range(4)]
    drafts = [q.sample(rng) for q in qs]
    data = P.encode(P.Verify(7, drafts, qs))
    assert len(data) == P.verify_size(4, [len(q.ids) for q in qs]) <= 4 * (4 + 5 + 6 * 64) + 21
    back = P.decode(data, P.Limits(vocab_size=vocab))
    assert back.drafts == drafts


def test_rounds_are_fitted_to_the_server_limit():
    """max_drafts caps γ so that every round fits; fit drops trailing drafts (with their q
    rows) from a round that would not, and leaves one that fits alone."""
    q = quantize(np.arange(1000), np.ones(1000))  # 6,005 bytes a row
    assert P.max_drafts(1 << 20, None) == P.MAX_DRAFTS
    assert P.max_drafts(20_000, 1000) == 3
    msg = P.Verify(3, [1, 2, 3, 4, 5], [q] * 5)
    fitted = P.fit(msg, 20_000)
    assert fitted.drafts == [1, 2, 3] and len(fitted.q) == 3
    assert len(P.encode(fitted)) <= 20_000 < len(P.encode(P.fit(msg, 30_000)))
    assert P.fit(msg, 1 << 20) is msg
    # and at most `most` drafts: the positions the server's session has left
    assert P.fit(msg, 1 << 20, most=2).drafts == [1, 2]
    assert P.fit(msg, 1 << 20, most=0) == P.Verify(3, [], None)


def header(kind: int, version: int = P.VERSION, magic: bytes = P.MAGIC) -> bytes:
    return P.HEADER.pack(magic, version, kind, 0, 0)


def verify_body(ids: list[int], q_kind: int = P.Q_NONE) -> bytes:
    return struct.pack("<IBI", 5, q_kind, len(ids)) + np.asarray(ids, "<i4").tobytes()


@pytest.mark.parametrize(
    "data, code, words",
    [
        (b"", P.BAD_MESSAGE, "shorter than the 12-byte header"),
        (header(P.VERIFY, magic=b"XX") + verify_body([1]), P.BAD_MESSAGE, "bad magic"),
        (header(P.VERIFY, version=9) + verify_body([1]), P.BAD_MESSAGE, "version 9"),
        (header(77), P.BAD_MESSAGE, "unknown message type 77"),
        (header(P.VERIFY) + verify_body([1])[:-2], P.BAD_MESSAGE, "truncated"),
        (header(P.VERIFY) + verify_body([1]) + b"\0", P.BAD_MESSAGE, "trailing"),
        (header(P.VERIFY) + verify_body([1, 100]), P.BAD_REQUEST, "token id 100"),
        (header(P.VERIFY) + verify_body([-1]), P.BAD_REQUEST, "token id -1"),
        (header(P.VERIFY) + verify_body(list(range(65))), P.TOO_LARGE, "exceed the limit"),
        (header(P.VERIFY) + verify_body([1], q_kind=7), P.BAD_MESSAGE, "q kind"),
        (header(P.END) + b"\0" * 5000, P.TOO_LARGE, "exceeds the limit of 4096"),
        ("a text frame", P.BAD_MESSAGE, "binary frames only"),
    ],
)
def test_malformed_messages_are_refused_with_the_reason(data, code, words):
    with pytest.raises(P.ProtocolError, match=words) as info:
        P.decode(data, LIMITS)
    assert info.value.code == code


def q_row(kind: int, ids: list[int], counts: list[int]) -> bytes:
    return (
        struct.pack("<BI", kind, len(ids))
        + np.asarray(ids, "<i4").tobytes()
        + np.asarray(counts, "<u2").tobytes()
    )


@pytest.mark.parametrize(
    "row, words",
    [
        (q_row(P.ROW_SUPPORT, [3, 4], [100, 200]), "do not sum to 65535"),
        (q_row(P.ROW_SUPPORT, [3, 3], [SCALE - 1, 1]), "names an id twice"),
        (q_row(P.ROW_SUPPORT, [3, 100], [SCALE - 1, 1]), "outside the vocabulary"),
        (q_row(P.ROW_SUPPORT, [4, 5], [SCALE - 1, 1]), "draft 3 is outside the support"),
        (q_row(P.ROW_SUPPORT, [], []), "support is empty"),
        (q_row(1, [3], [SCALE]), "float32 q rows .protocol 1. are not accepted"),
        (q_row(9, [3], [SCALE]), "unknown q row kind 9"),
    ],
)
def test_q_rows_must_be_the_distributions_drafts_came_from(row, words):
    data = header(P.VERIFY) + verify_body([3], q_kind=P.Q_ROWS) + row
    with pytest.raises(P.ProtocolError, match=words):
        P.decode(data, LIMITS)


def test_a_sparse_q_holds_exactly_its_counts():
    q = SparseQ(np.array([7, 2], np.int32), np.array([SCALE - 5, 5]))
    assert q.prob(2) == 5 / SCALE and q.prob(3) == 0.0 and q.check(10) is None


def test_start_with_bad_sampling_parameters_is_refused():
    data = P.encode(P.Start([1], 8, temperature=1.0, top_p=0.5))
    data = data.replace(struct.pack("<f", 0.5), struct.pack("<f", 2.0))
    with pytest.raises(P.ProtocolError, match="out of range"):
        P.decode(data, LIMITS)


def test_tree_messages_are_compact_and_their_answers_checked():
    """A node costs 5 bytes (its id and its parent's byte), the answer 1 + its path; a PATH
    whose count is not its accepted count, or whose nodes do not ascend, is refused."""
    tree = P.Verify(12, list(range(16)), None, [-1] + list(range(15)))
    assert len(P.encode(tree)) == P.verify_size(16, None, tree=True) == 12 + 5 + 4 + 5 * 16
    assert P.fit(tree, P.verify_size(7, None, tree=True)).parents == list(range(-1, 6))
    good = P.encode(P.Result(2, 17, 15, 0.25, path=[1, 3]))
    assert P.HEADER.unpack_from(good)[2] == P.PATH
    with pytest.raises(P.ProtocolError, match="2 accepted"):
        P.decode(good[:-3] + bytes([1, 1]))
    with pytest.raises(P.ProtocolError, match="do not ascend"):
        P.decode(good[:-2] + bytes([3, 1]))
    with pytest.raises(P.ProtocolError, match="unknown q kind"):
        P.decode(
            P.encode(P.Verify(3, [1])).replace(b"\x00\x01\x00\x00\x00", b"\x04\x01\x00\x00\x00", 1)
        )
