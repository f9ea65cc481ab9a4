"""The split-decoding wire format: compact binary messages, one per WebSocket frame.

Every message is a 12-byte header then a type-specific body, all little-endian:

    header   magic b"ES" | version u8 | type u8 | session u32 | round u32
    START    c->s  flags u8 | top_k u32 | temperature f32 | top_p f32 | seed u64 |
                   capacity u32 | fingerprint: u16 length + utf-8 | ids: u32 count + int32[]
             a new generation: the server prefills `ids` (a prompt, or on reconnect the whole
             committed sequence) into a fresh KV cache of `capacity` positions and answers
             RESULT with the next token (accepted = 0). fingerprint: the bundle's backbone
             fingerprint, or from a shared-backbone edge bundle `backbone:K:TOKENIZER:LOWER`
             (`edgespec.backbone`); the server answers a mismatch with ERROR 403
    VERIFY   c->s  base u32 | q kind u8 | drafts: u32 count + int32[] | q rows
             drafts d_1..d_γ after the `base` committed tokens (γ = 0: the server just
             generates one token). Sampling with a model drafter sends each draft's q row:
             (q kind 1), each dense (u8 1, u32 V, float32[V]) or, when top-k/top-p truncated
             it, sparse (u8 2, u32 n, int32[n] ids, float32[n] probs): the residual
             norm(max(0, p - q)) needs the whole row, not just q(d_i)
    RESULT   s->c  accepted u16 | token i32 | length u32 | server_seconds f32
                   [| max_context u32 | max_request_bytes u32]  the server's limits, only
             in the answer to a START and only to a device that offered the WebSocket
             subprotocol `edgespec.limits` (older devices never see the extra 8 bytes;
             an older server never sends them, and the device then knows no limits)
    ERROR    s->c  code u16 | text: u16 length + utf-8
    END      c->s  (no body) the generation is over; the server frees its cache

`decode()` is strict: a wrong magic/version, an unknown type, a truncated or overlong body,
counts that exceed the limits and non-finite or negative probabilities all raise
`ProtocolError` naming the problem. numpy + stdlib only, shared by client and server.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"ES"
VERSION = 1
HEADER = struct.Struct("<2sBBII")
START_HEAD = struct.Struct("<BIffQI")
VERIFY_HEAD = struct.Struct("<IB")
RESULT_BODY = struct.Struct("<HiIf")
LIMITS_BODY = struct.Struct("<II")
SUBPROTOCOL = "edgespec.limits"  # a device that reads the limits in START's RESULT
MAX_DRAFTS = 64  # more drafts per round than any policy asks for is a malformed request
MAX_TEXT = 4096

# message types
START, VERIFY, RESULT, ERROR, END = 1, 2, 3, 4, 5
NAMES = {START: "START", VERIFY: "VERIFY", RESULT: "RESULT", ERROR: "ERROR", END: "END"}

# START flags
SAMPLING, HAS_SEED = 1, 2
# VERIFY: whether q rows follow the drafts, and how each row is stored
Q_NONE, Q_ROWS = 0, 1
ROW_DENSE, ROW_SPARSE = 1, 2

# ERROR codes (HTTP-like, so they read familiar in logs)
BAD_MESSAGE = 400
UNAUTHORIZED = 401
INCOMPATIBLE = 403
IDLE_TIMEOUT = 408
OUT_OF_SYNC = 409
TOO_LARGE = 413
BAD_REQUEST = 422
INTERNAL = 500
UNAVAILABLE = 503  # server full or shutting down: try again later / elsewhere


class ProtocolError(ValueError):
    """A message that cannot be decoded, with the reason; `code` is the ERROR code to send."""

    def __init__(self, reason: str, code: int = BAD_MESSAGE) -> None:
        super().__init__(reason)
        self.code = code


@dataclass
class Start:
    ids: list[int]
    capacity: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    fingerprint: str = ""
    session: int = 0
    round: int = 0


@dataclass
class Verify:
    base: int  # committed tokens the client assumes the server holds
    drafts: list[int]
    q: list[np.ndarray] | None = None  # float64 rows [V] (sparse rows are expanded)
    session: int = 0
    round: int = 0


@dataclass
class ServerLimits:
    """What one session of this server may use: positions, and bytes per message."""

    max_context: int
    max_request_bytes: int


@dataclass
class Result:
    accepted: int
    token: int
    length: int  # committed tokens on the server after this round
    server_seconds: float
    session: int = 0
    round: int = 0
    limits: ServerLimits | None = None  # in the answer to START, when negotiated


@dataclass
class Error:
    code: int
    text: str
    session: int = 0
    round: int = 0


@dataclass
class End:
    session: int = 0
    round: int = 0


Message = Start | Verify | Result | Error | End


@dataclass
class Limits:
    """What a decoder accepts: the vocabulary (for ids and q rows) and the request size."""

    vocab_size: int = 1 << 31
    max_bytes: int = 1 << 24
    max_ids: int = 1 << 20


# -- encoding -------------------------------------------------------------------------------
def _header(kind: int, session: int, round_: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, session, round_)


def _ids(ids: list[int]) -> bytes:
    return struct.pack("<I", len(ids)) + np.asarray(ids, dtype="<i4").tobytes()


def _text(text: str, limit: int = MAX_TEXT) -> bytes:
    raw = text.encode()[:limit]
    return struct.pack("<H", len(raw)) + raw


def encode(msg: Message) -> bytes:
    if isinstance(msg, Start):
        flags = (SAMPLING if msg.temperature > 0 else 0) | (HAS_SEED if msg.seed is not None else 0)
        head = START_HEAD.pack(
            flags, msg.top_k, msg.temperature, msg.top_p, msg.seed or 0, msg.capacity
        )
        body = head + _text(msg.fingerprint, 256) + _ids(msg.ids)
        return _header(START, msg.session, msg.round) + body
    if isinstance(msg, Verify):
        body = VERIFY_HEAD.pack(msg.base, Q_NONE if msg.q is None else Q_ROWS)
        body += _ids(msg.drafts)
        for row in msg.q or []:
            (nonzero,) = np.nonzero(row)
            # sparse when top-k/top-p truncated the row (ids + probs), else dense is smaller
            if 2 * len(nonzero) < len(row):
                body += struct.pack("<BI", ROW_SPARSE, len(nonzero))
                body += nonzero.astype("<i4").tobytes() + row[nonzero].astype("<f4").tobytes()
            else:
                body += struct.pack("<BI", ROW_DENSE, len(row)) + row.astype("<f4").tobytes()
        return _header(VERIFY, msg.session, msg.round) + body
    if isinstance(msg, Result):
        body = RESULT_BODY.pack(msg.accepted, msg.token, msg.length, msg.server_seconds)
        if msg.limits is not None:
            body += LIMITS_BODY.pack(msg.limits.max_context, msg.limits.max_request_bytes)
        return _header(RESULT, msg.session, msg.round) + body
    if isinstance(msg, Error):
        return (
            _header(ERROR, msg.session, msg.round) + struct.pack("<H", msg.code) + _text(msg.text)
        )
    if isinstance(msg, End):
        return _header(END, msg.session, msg.round)
    raise TypeError(f"not a protocol message: {msg!r}")


def fit_drafts(
    base: int, drafts: list[int], q: list[np.ndarray] | None, limits: ServerLimits, room: int
) -> int:
    """How many of `drafts` one VERIFY after `base` tokens may carry: at most `room` more
    positions (the session's context on the server), and the encoded message within the
    server's request size (dense q rows are large: sampling over a big vocabulary may fit
    only a few, or none: γ = 0 always fits)."""
    n = max(0, min(len(drafts), room, MAX_DRAFTS))
    while n and len(encode(Verify(base, drafts[:n], q[:n] if q else None))) > (
        limits.max_request_bytes
    ):
        n -= 1
    return n


# -- decoding -------------------------------------------------------------------------------
class _Reader:
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

    def text(self, field_name: str) -> str:
        (n,) = struct.unpack("<H", self.take(2, field_name + " length"))
        try:
            return self.take(n, field_name).decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.what}: {field_name} is not valid utf-8") from None

    def done(self) -> None:
        if self.offset != len(self.data):
            extra = len(self.data) - self.offset
            raise ProtocolError(f"{self.what} message has {extra} unexpected trailing bytes")


def decode(data: bytes | str, limits: Limits | None = None) -> Message:
    """Parse one message; anything malformed raises ProtocolError with the reason."""
    limits = limits or Limits()
    if isinstance(data, str):
        raise ProtocolError("text frame received: this protocol uses binary frames only")
    if len(data) > limits.max_bytes:
        raise ProtocolError(
            f"message of {len(data)} bytes exceeds the limit of {limits.max_bytes}", TOO_LARGE
        )
    if len(data) < HEADER.size:
        raise ProtocolError(f"message of {len(data)} bytes is shorter than the 12-byte header")
    magic, version, kind, session, round_ = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}: not an edgespec split-decoding message")
    if version != VERSION:
        raise ProtocolError(
            f"protocol version {version} is not supported (this side speaks {VERSION}): "
            "use the same edgespec version on device and server"
        )
    if kind not in NAMES:
        raise ProtocolError(f"unknown message type {kind}")
    r = _Reader(data, HEADER.size, NAMES[kind])
    msg: Message
    if kind == START:
        flags, top_k, temperature, top_p, seed, capacity = r.unpack(START_HEAD, "START fields")
        if flags & ~(SAMPLING | HAS_SEED):
            raise ProtocolError(f"START: unknown flags {flags:#x}")
        if not (np.isfinite(temperature) and temperature >= 0 and 0 < top_p <= 1):
            raise ProtocolError(
                f"START: sampling parameters out of range (temperature {temperature}, "
                f"top_p {top_p})",
                BAD_REQUEST,
            )
        fingerprint = r.text("fingerprint")
        ids = r.ids("prompt ids", limits.max_ids, limits.vocab_size)
        msg = Start(
            ids,
            capacity,
            temperature if flags & SAMPLING else 0.0,
            top_p,
            top_k,
            seed if flags & HAS_SEED else None,
            fingerprint,
        )
    elif kind == VERIFY:
        base, q_kind = r.unpack(VERIFY_HEAD, "VERIFY fields")
        if q_kind not in (Q_NONE, Q_ROWS):
            raise ProtocolError(f"VERIFY: unknown q kind {q_kind}")
        drafts = r.ids("drafts", MAX_DRAFTS, limits.vocab_size)
        q = [_q_row(r, limits.vocab_size) for _ in drafts] if q_kind == Q_ROWS else None
        msg = Verify(base, drafts, q)
    elif kind == RESULT:
        accepted, token, length, seconds = r.unpack(RESULT_BODY, "RESULT fields")
        msg = Result(accepted, token, length, seconds)
        if len(data) - r.offset == LIMITS_BODY.size:
            msg.limits = ServerLimits(*r.unpack(LIMITS_BODY, "RESULT limits"))
    elif kind == ERROR:
        (code,) = r.unpack(struct.Struct("<H"), "ERROR code")
        msg = Error(code, r.text("ERROR text"))
    else:
        msg = End()
    r.done()
    msg.session, msg.round = session, round_
    return msg


def _q_row(r: _Reader, vocab: int) -> np.ndarray:
    """One draft distribution row, as float64 [V] (what the acceptance test computes with)."""
    row_kind, n = r.unpack(struct.Struct("<BI"), "q row header")
    if n > vocab:
        raise ProtocolError(f"VERIFY: a q row of {n} entries exceeds the vocabulary ({vocab})")
    # arbitrary bytes may hold signalling NaNs: casting them raises numpy's "invalid" flag
    # (a RuntimeWarning per hostile message); they are refused just below
    with np.errstate(invalid="ignore"):
        if row_kind == ROW_DENSE:
            if n != vocab:
                raise ProtocolError(
                    f"VERIFY: a dense q row has {n} entries, the vocabulary {vocab}"
                )
            row = np.frombuffer(r.take(4 * n, "q row"), dtype="<f4").astype(np.float64)
        elif row_kind == ROW_SPARSE:
            ids = np.frombuffer(r.take(4 * n, "q row ids"), dtype="<i4")
            probs = np.frombuffer(r.take(4 * n, "q row probs"), dtype="<f4")
            if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
                raise ProtocolError("VERIFY: a sparse q row names ids outside the vocabulary")
            row = np.zeros(vocab)
            row[ids] = probs
        else:
            raise ProtocolError(f"VERIFY: unknown q row kind {row_kind}")
    if not np.all(np.isfinite(row)) or row.min() < 0 or not 0.5 < row.sum() < 1.5:
        raise ProtocolError("VERIFY: a q row is not a probability distribution")
    return row
