"""The split-decoding wire format: round trips, and every malformed message refused by name."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from edgespec import protocol as P

LIMITS = P.Limits(vocab_size=100, max_bytes=4096, max_ids=64)


def test_every_message_round_trips():
    q = [np.full(100, 0.01), np.eye(100)[7]]
    msgs = [
        P.Start([1, 2, 3], 40, 0.7, 0.9, 5, 1234, "sha256:abc", session=3, round=1),
        P.Start([5], 8),
        P.Verify(12, [4, 5], q, round=9),
        P.Verify(12, []),
        P.Result(2, 17, 15, 0.25, 3, 9),
        P.Error(P.TOO_LARGE, "too big é", 3, 9),
        P.End(3, 10),
    ]
    for msg in msgs:
        back = P.decode(P.encode(msg), LIMITS)
        if isinstance(msg, P.Verify) and msg.q is not None:
            assert back.q is not None
            for a, b in zip(back.q, msg.q, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-6)
            back.q = msg.q
        if isinstance(msg, P.Start):
            assert back.temperature == pytest.approx(msg.temperature)
            assert back.top_p == pytest.approx(msg.top_p)
            back.temperature, back.top_p = msg.temperature, msg.top_p
        if isinstance(msg, P.Result):
            assert back.server_seconds == pytest.approx(msg.server_seconds)
            back.server_seconds = msg.server_seconds
        assert back == msg


def test_a_truncated_q_row_is_sent_sparse():
    row = np.zeros(100)
    row[[3, 9]] = [0.25, 0.75]
    sparse = P.encode(P.Verify(1, [3], [row]))
    dense = P.encode(P.Verify(1, [3], [np.full(100, 0.01)]))
    assert len(sparse) < 60 < 400 < len(dense)


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


def test_q_rows_must_be_distributions():
    bad = np.full(100, 0.01)
    bad[0] = np.nan
    with pytest.raises(P.ProtocolError, match="not a probability distribution"):
        P.decode(P.encode(P.Verify(1, [3], [bad])), LIMITS)
    short = P.encode(P.Verify(1, [3], [np.full(50, 0.02)]))
    with pytest.raises(P.ProtocolError, match="dense q row has 50 entries"):
        P.decode(short, LIMITS)


def test_start_with_bad_sampling_parameters_is_refused():
    data = P.encode(P.Start([1], 8, temperature=1.0, top_p=0.5))
    data = data.replace(struct.pack("<f", 0.5), struct.pack("<f", 2.0))
    with pytest.raises(P.ProtocolError, match="out of range"):
        P.decode(data, LIMITS)
