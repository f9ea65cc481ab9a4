"""The split protocol's errors and its strict reader (a leaf `protocol` builds on and
re-exports: callers use `protocol.ProtocolError`, `protocol.BUSY`, ...).

`Reader` consumes a message body front to back, every read checking the bytes are there, the
counts within their limits and the ids within the vocabulary; `q_row` reads one VERIFY q row
(a quantized sparse support) and checks it is a distribution holding its draft. Every
problem is a `ProtocolError` naming it, with the ERROR code to answer.
"""

from __future__ import annotations

import struct

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.sparse_q import SCALE, SparseQ

# ERROR codes (HTTP-like, so they read familiar in logs)
BAD_MESSAGE = 400
UNAUTHORIZED = 401
INCOMPATIBLE = 403
IDLE_TIMEOUT = 408
OUT_OF_SYNC = 409
GONE = 410  # no session to resume on this connection: START again with keep = 0
TOO_LARGE = 413
BUSY = 429  # "verify only": the server streams no more sessions now; split rounds go on
BAD_REQUEST = 422
INTERNAL = 500
UNAVAILABLE = 503  # server full or shutting down: try again later / elsewhere
ROW_HEAD = struct.Struct("<BI")
ROW_SUPPORT = 3  # (1, 2: protocol 1's dense and sparse float32 rows, no longer accepted)


class ProtocolError(EdgespecError, ValueError):
    """A message that cannot be decoded, with the reason; `code` is the ERROR code to send."""

    def __init__(self, reason: str, code: int = BAD_MESSAGE) -> None:
        super().__init__(reason)
        self.code = code


class Reader:
    """Consumes a body front to back; every read checks the bytes are there."""

    def __init__(self, data: bytes, offset: int, what: str) -> None:
        self.data, self.offset, self.what = data, offset, what

    def take(self, n: int, field_name: str) -> bytes:
        if n < 0 or self.offset + n > len(self.data):
            raise ProtocolError(
                f"{self.what} message is truncated: {field_name} needs {n} bytes at offset "
                f"{self.offset}, the message has {len(self.data)}"
            )
        chunk = self.data[self.offset : self.offset + n]
        self.offset += n
        return chunk

    def unpack(self, fmt: struct.Struct, field_name: str) -> tuple:
        return fmt.unpack(self.take(fmt.size, field_name))

    def count(self, field_name: str, limit: int) -> int:
        (n,) = struct.unpack("<I", self.take(4, field_name + " count"))
        if n > limit:
            raise ProtocolError(
                f"{self.what}: {n} {field_name} exceed the limit {limit}", TOO_LARGE
            )
        return n

    def ids(self, field_name: str, limit: int, vocab: int) -> list[int]:
        n = self.count(field_name, limit)
        ids = np.frombuffer(self.take(4 * n, field_name), dtype="<i4")
        bad = ids[(ids < 0) | (ids >= vocab)]
        if len(bad):
            raise ProtocolError(
                f"{self.what}: token id {int(bad[0])} in {field_name} is outside the "
                f"vocabulary (0..{vocab - 1})",
                BAD_REQUEST,
            )
        return ids.tolist()

    def text(self, field_name: str, width: str = "<H") -> str:
        (n,) = struct.unpack(width, self.take(struct.calcsize(width), field_name + " length"))
        try:
            return self.take(n, field_name).decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.what}: {field_name} is not valid utf-8") from None

    def done(self) -> None:
        if self.offset != len(self.data):
            extra = len(self.data) - self.offset
            raise ProtocolError(f"{self.what} message has {extra} unexpected trailing bytes")


def q_row(r: Reader, draft: int, vocab: int) -> SparseQ:
    """The distribution one draft was drawn from (its support and counts)."""
    row_kind, n = r.unpack(ROW_HEAD, "q row header")
    if row_kind in (1, 2):
        raise ProtocolError(
            "VERIFY: float32 q rows (protocol 1) are not accepted: q rows are sent as "
            "quantized supports; use the same edgespec version on device and server"
        )
    if row_kind != ROW_SUPPORT:
        raise ProtocolError(f"VERIFY: unknown q row kind {row_kind}")
    if n > min(vocab, SCALE):
        raise ProtocolError(f"VERIFY: a q row of {n} ids exceeds the vocabulary ({vocab})")
    ids = np.frombuffer(r.take(4 * n, "q row ids"), dtype="<i4").astype(np.int32)
    counts = np.frombuffer(r.take(2 * n, "q row counts"), dtype="<u2").astype(np.int64)
    q = SparseQ(ids, counts)
    problem = q.check(vocab)
    if problem is not None:
        raise ProtocolError(f"VERIFY: a q row is not a probability distribution: {problem}")
    if q.prob(draft) == 0:
        raise ProtocolError(
            f"VERIFY: draft {draft} is outside the support of its q row: a draft must be "
            "sampled from the distribution sent with it",
            BAD_REQUEST,
        )
    return q


MAX_TREE_DEPTH = 32  # deeper trees than any drafter grows are a malformed request


def tree_parents(r: Reader, n: int) -> list[int]:
    """A VERIFY tree's parents, one byte per node (its parent's index + 1; 0: the root),
    checked to form a tree: each parent comes before its child (so there is no cycle), and
    no node is deeper than MAX_TREE_DEPTH."""
    raw = r.take(n, "tree parents")
    parents, depth = [b - 1 for b in raw], []
    for i, p in enumerate(parents):
        if p >= i:
            raise ProtocolError(
                f"VERIFY: tree node {i}'s parent is node {p}: a parent must be the root (byte "
                "0) or an earlier node (byte = its index + 1)",
                BAD_REQUEST,
            )
        depth.append(1 if p < 0 else depth[p] + 1)
        if depth[-1] > MAX_TREE_DEPTH:
            raise ProtocolError(
                f"VERIFY: tree node {i} is {depth[-1]} deep, beyond the limit of "
                f"{MAX_TREE_DEPTH}: send a shallower tree",
                TOO_LARGE,
            )
    return parents


def tree_path(r: Reader, accepted: int) -> list[int]:
    """A PATH's kept nodes: as many as it accepted, in ascending node order."""
    (n,) = r.unpack(struct.Struct("<B"), "path count")
    if n != accepted:
        raise ProtocolError(f"PATH: {n} nodes for {accepted} accepted drafts")
    path = list(r.take(n, "path nodes"))
    if any(b <= a for a, b in zip(path, path[1:], strict=False)):
        raise ProtocolError(f"PATH: nodes {path} do not ascend: not a root path")
    return path
