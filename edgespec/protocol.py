"""The split-decoding wire format: compact binary messages, one per WebSocket frame.

Every message is a 12-byte header then a type-specific body, all little-endian:

    header   magic b"ES" | version u8 | type u8 | session u32 | round u32
    START    c->s  flags u8 | top_k u32 | temperature f32 | top_p f32 | seed u64 |
                   capacity u32 | keep u32 | fingerprint: u16 length + utf-8 |
                   ids: u32 count + int32[]
             keep = 0: a new generation; the server prefills `ids` (a prompt, or on reconnect
             the whole committed sequence) into a fresh KV cache of `capacity` positions and
             answers RESULT with the next token (accepted = 0). keep > 0: this connection's
             session is resumed (a conversation's next turn): its cache keeps its first `keep`
             positions and prefills only `ids`, with this START's sampling and capacity. No
             session here (none started, ENDed, a failed prefill): ERROR 410; `keep` past its
             cache: ERROR 409; both leave connection and session as they were, and the device
             STARTs again with keep = 0. fingerprint: the bundle's backbone fingerprint, or
             from a shared-backbone edge bundle `backbone:K:TOKENIZER:LOWER`
             (`edgespec.backbone`); a mismatch: ERROR 403. GRAMMAR flag: `| u32 length +
             utf-8 llguidance grammar | start u32` (ERROR 422 if unusable)
    VERIFY   c->s  base u32 | q kind u8 | drafts: u32 count + int32[] | q rows
             drafts d_1..d_γ after the `base` committed tokens (γ = 0: the server just
             generates one token). Sampling with a model drafter sends (q kind 1) the support
             each draft was drawn from: u8 3 | u32 n | int32[n] ids | u16[n] counts, q(id) =
             count / 65535 exactly (`sparse_q`: the drafter samples from exactly this, so the
             residual norm(max(0, p - q)) stays exact). Each draft must be in its support.
             Protocol 1's float32 rows (kinds 1, 2) are refused. TREE (kind | 2, only to a
             server that offers trees): the drafts are a token tree's nodes, then u8[count]
             parents (node i's parent + 1, 0: the root = the last committed token; a parent
             comes before its child; depth <= MAX_TREE_DEPTH), then a q row per node
    RESULT   s->c  accepted u16 | token i32 | length u32 | server_seconds f32 [| max_context
             u32 | max_request_bytes u32 | stream_rate f32 | stream_room u16] the limits and
             streaming offer, in the answer to a START to a device that offered the WebSocket
             subprotocol `edgespec.limits` (else none: the device knows no limits). Rounds are
             sized to them (`max_drafts`, `fit`). stream_rate: tokens/s the server's recent
             streams ran at, each (0: none yet); stream_room: streams it would start now
             [| tree_nodes u16: the largest tree it verifies (0: none), to a device that
             offered `edgespec.trees`]. PATH s->c: a tree round's RESULT | u8 accepted | u8[]
             the kept root path's nodes, ascending
    ERROR    s->c  code u16 | text: u16 length + utf-8
    END      c->s  (no body) the generation is over; the server frees its cache
    PAUSE    c->s  (no body) the generation is over; the server keeps its cache for a START
             that resumes it (neither END nor PAUSE is answered) until it is resumed or ENDed,
             its connection closes, it idles for the idle timeout, or a new connection finds
             the server full: the session paused longest ago is evicted (ERROR 410, closed)
    STREAM   c->s  base u32 | most u32  the server decodes on its own after `base` committed
             tokens with its best mode, at most `most` (it stops after an end of text),
             sending TOKENS per round. ERROR 429 ("verify only"): it streams no more sessions
             now; connection and session stay, VERIFY rounds go on
    TOKENS   s->c  flags u8 | length u32 | server_seconds f32 | ids: u32 count + int32[]
             one streamed round's tokens (at least one); `length`: the session's committed
             tokens after them. FINAL: the stream is over (its `most`, an end of text, a STOP,
             or SHED: the server got busy and hands decoding back); VERIFY etc. may follow
    STOP     c->s  (no body) end the stream after the round the server runs: its TOKENS are
             FINAL (no stream: ignored); both sides then hold every token streamed

`decode()` is strict (`wire.Reader`): a wrong magic/version, an unknown type, a truncated or
overlong body, counts over the limits and q rows that are not distributions (or miss their
draft) raise `ProtocolError` naming the problem. numpy + stdlib only, shared by both sides."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from edgespec.sparse_q import SparseQ
from edgespec.wire import BAD_MESSAGE as BAD_MESSAGE  # re-exported: codes and error
from edgespec.wire import BAD_REQUEST as BAD_REQUEST
from edgespec.wire import BUSY as BUSY
from edgespec.wire import GONE as GONE
from edgespec.wire import IDLE_TIMEOUT as IDLE_TIMEOUT
from edgespec.wire import INCOMPATIBLE as INCOMPATIBLE
from edgespec.wire import INTERNAL as INTERNAL
from edgespec.wire import OUT_OF_SYNC as OUT_OF_SYNC
from edgespec.wire import ROW_HEAD as ROW_HEAD
from edgespec.wire import ROW_SUPPORT as ROW_SUPPORT
from edgespec.wire import TOO_LARGE as TOO_LARGE
from edgespec.wire import UNAUTHORIZED as UNAUTHORIZED
from edgespec.wire import UNAVAILABLE as UNAVAILABLE
from edgespec.wire import ProtocolError as ProtocolError
from edgespec.wire import Reader as _Reader
from edgespec.wire import q_row as _q_row
from edgespec.wire import tree_parents as _tree_parents
from edgespec.wire import tree_path as _tree_path

MAGIC = b"ES"
VERSION = 4  # 2: sparse q; 3: keep, PAUSE, STREAM, TOKENS, STOP; 4: stream offer, SHED, trees
HEADER = struct.Struct("<2sBBII")
START_HEAD = struct.Struct("<BIffQII")
VERIFY_HEAD = struct.Struct("<IB")
RESULT_BODY = struct.Struct("<HiIf")
LIMITS_BODY = struct.Struct("<IIfH")
STREAM_BODY = struct.Struct("<II")
TOKENS_HEAD = struct.Struct("<BIf")
TREES_BODY = struct.Struct("<H")
SUBPROTOCOL = "edgespec.limits"  # a device that reads the limits in START's RESULT
TREES = "edgespec.trees"  # ... and may send token trees (implies the limits)
MAX_DRAFTS = 64  # more drafts per round than any policy asks for is a malformed request
MAX_TEXT = 4096

# message types
START, VERIFY, RESULT, ERROR, END, PAUSE, STREAM, TOKENS, STOP, PATH = range(1, 11)
_KINDS = ("START", "VERIFY", "RESULT", "ERROR", "END", "PAUSE", "STREAM", "TOKENS", "STOP", "PATH")
NAMES = dict(enumerate(_KINDS, 1))

# START flags
SAMPLING, HAS_SEED, GRAMMAR = 1, 2, 4
# VERIFY: whether q rows follow the drafts, and how each row is stored
Q_NONE, Q_ROWS, TREE = 0, 1, 2
# TOKENS flags
FINAL, SHED = 1, 2


@dataclass
class Start:
    ids: list[int]
    capacity: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    fingerprint: str = ""
    keep: int = 0  # positions of this connection's session cache that stay (0: a new one)
    grammar: tuple[str, int] | None = None  # (llguidance grammar, where the output starts)
    session: int = 0
    round: int = 0


@dataclass
class Verify:
    base: int  # committed tokens the client assumes the server holds
    drafts: list[int]
    q: list[SparseQ] | None = None  # the distribution each draft was drawn from
    parents: list[int] | None = None  # a token tree: each draft's parent node (-1: the root)
    session: int = 0
    round: int = 0


@dataclass
class ServerLimits:
    """A session's positions and bytes per message; the streaming offer (RESULT's doc)."""

    max_context: int
    max_request_bytes: int
    stream_rate: float = 0.0
    stream_room: int = 0
    tree_nodes: int | None = None  # the largest tree verified (0: none; None: not asked)


@dataclass
class Result:
    accepted: int
    token: int
    length: int  # committed tokens on the server after this round
    server_seconds: float
    session: int = 0
    round: int = 0
    limits: ServerLimits | None = None  # in the answer to START, when negotiated
    path: list[int] | None = None  # a tree round's: the accepted nodes (a PATH message)


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


@dataclass
class Pause:
    session: int = 0
    round: int = 0


@dataclass
class Stream:
    base: int  # committed tokens the client assumes the server holds
    most: int  # tokens to stream at most
    session: int = 0
    round: int = 0


@dataclass
class Tokens:
    ids: list[int]  # one server round's tokens, in order
    length: int  # committed tokens on the server after them
    server_seconds: float
    final: bool = False
    shed: bool = False  # final because the server got busy: decode on the device
    session: int = 0
    round: int = 0


@dataclass
class Stop:
    session: int = 0
    round: int = 0


Message = Start | Verify | Result | Error | End | Pause | Stream | Tokens | Stop


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


def _text(text: str, limit: int = MAX_TEXT, width: str = "<H") -> bytes:
    raw = text.encode()[:limit]
    return struct.pack(width, len(raw)) + raw


def encode(msg: Message) -> bytes:
    if isinstance(msg, Start):
        flags = (SAMPLING if msg.temperature > 0 else 0) | (HAS_SEED if msg.seed is not None else 0)
        flags |= GRAMMAR if msg.grammar else 0
        head = START_HEAD.pack(
            flags, msg.top_k, msg.temperature, msg.top_p, msg.seed or 0, msg.capacity, msg.keep
        )
        body = head + _text(msg.fingerprint, 256) + _ids(msg.ids)
        if msg.grammar:
            body += _text(msg.grammar[0], 1 << 30, "<I") + struct.pack("<I", msg.grammar[1])
        return _header(START, msg.session, msg.round) + body
    if isinstance(msg, Verify):
        kind = (Q_NONE if msg.q is None else Q_ROWS) | (TREE if msg.parents is not None else 0)
        body = VERIFY_HEAD.pack(msg.base, kind) + _ids(msg.drafts)
        if msg.parents is not None:
            body += bytes(p + 1 for p in msg.parents)
        for q in msg.q or []:
            body += ROW_HEAD.pack(ROW_SUPPORT, len(q.ids))
            body += q.ids.astype("<i4").tobytes() + q.counts.astype("<u2").tobytes()
        return _header(VERIFY, msg.session, msg.round) + body
    if isinstance(msg, Result):
        body = RESULT_BODY.pack(msg.accepted, msg.token, msg.length, msg.server_seconds)
        if msg.limits is not None:
            x = msg.limits
            body += LIMITS_BODY.pack(x.max_context, x.max_request_bytes, x.stream_rate,
                                     min(max(x.stream_room, 0), 0xFFFF))  # fmt: skip
            body += TREES_BODY.pack(x.tree_nodes) if x.tree_nodes is not None else b""
        if msg.path is not None:
            body += bytes([len(msg.path), *msg.path])
        return _header(RESULT if msg.path is None else PATH, msg.session, msg.round) + body
    if isinstance(msg, Error):
        body = struct.pack("<H", msg.code) + _text(msg.text)
        return _header(ERROR, msg.session, msg.round) + body
    if isinstance(msg, End | Pause):
        return _header(END if isinstance(msg, End) else PAUSE, msg.session, msg.round)
    if isinstance(msg, Stream):
        return _header(STREAM, msg.session, msg.round) + STREAM_BODY.pack(msg.base, msg.most)
    if isinstance(msg, Tokens):
        flags = (FINAL if msg.final or msg.shed else 0) | (SHED if msg.shed else 0)
        head = TOKENS_HEAD.pack(flags, msg.length, msg.server_seconds)
        return _header(TOKENS, msg.session, msg.round) + head + _ids(msg.ids)
    if isinstance(msg, Stop):
        return _header(STOP, msg.session, msg.round)
    raise TypeError(f"not a protocol message: {msg!r}")


# -- decoding -------------------------------------------------------------------------------
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
        flags, top_k, temperature, top_p, seed, capacity, keep = r.unpack(
            START_HEAD, "START fields"
        )
        if flags & ~(SAMPLING | HAS_SEED | GRAMMAR):
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
            keep,
            (r.text("grammar", "<I"), r.count("start", 2**31)) if flags & GRAMMAR else None,
        )
    elif kind == VERIFY:
        base, q_kind = r.unpack(VERIFY_HEAD, "VERIFY fields")
        if q_kind & ~(Q_ROWS | TREE):
            raise ProtocolError(f"VERIFY: unknown q kind {q_kind}")
        drafts = r.ids("drafts", MAX_DRAFTS, limits.vocab_size)
        parents = _tree_parents(r, len(drafts)) if q_kind & TREE else None
        q = [_q_row(r, d, limits.vocab_size) for d in drafts] if q_kind & Q_ROWS else None
        msg = Verify(base, drafts, q, parents)
    elif kind in (RESULT, PATH):
        accepted, token, length, seconds = r.unpack(RESULT_BODY, "RESULT fields")
        msg = Result(accepted, token, length, seconds)
        if kind == RESULT and len(data) - r.offset in (14, 16):  # LIMITS_BODY (+ TREES_BODY)
            msg.limits = ServerLimits(*r.unpack(LIMITS_BODY, "RESULT limits"))
            if len(data) - r.offset == TREES_BODY.size:
                (msg.limits.tree_nodes,) = r.unpack(TREES_BODY, "RESULT tree nodes")
        if kind == PATH:
            msg.path = _tree_path(r, accepted)
    elif kind == ERROR:
        (code,) = r.unpack(struct.Struct("<H"), "ERROR code")
        msg = Error(code, r.text("ERROR text"))
    elif kind == STREAM:
        msg = Stream(*r.unpack(STREAM_BODY, "STREAM fields"))
    elif kind == TOKENS:
        flags, length, seconds = r.unpack(TOKENS_HEAD, "TOKENS fields")
        if flags & ~(FINAL | SHED):
            raise ProtocolError(f"TOKENS: unknown flags {flags:#x}")
        ids = r.ids("tokens", limits.max_ids, limits.vocab_size)
        if not ids:
            raise ProtocolError("TOKENS carries no token: a streamed round has at least one")
        msg = Tokens(ids, length, seconds, bool(flags & (FINAL | SHED)), bool(flags & SHED))
    elif kind == STOP:
        msg = Stop()
    elif kind == END:
        msg = End()
    else:
        msg = Pause()
    r.done()
    msg.session, msg.round = session, round_
    return msg


def verify_size(drafts: int, support_sizes: list[int] | None, tree: bool = False) -> int:
    """Bytes of a VERIFY message with `drafts` drafts (a tree's nodes: with their parents)
    and q rows of these support sizes."""
    rows = sum(ROW_HEAD.size + 6 * n for n in support_sizes or [])
    return HEADER.size + VERIFY_HEAD.size + 4 + (5 if tree else 4) * drafts + rows


def max_drafts(max_request: int, row_ids: int | None) -> int:
    """The most drafts a VERIFY within `max_request` bytes can carry, each with a q row of
    at most `row_ids` ids (None: no q rows)."""
    per_draft = 4 + (ROW_HEAD.size + 6 * row_ids if row_ids is not None else 0)
    room = max_request - verify_size(0, None)
    return max(0, min(MAX_DRAFTS, room // per_draft))


def fit(msg: Verify, max_request: int, most: int = MAX_DRAFTS) -> Verify:
    """`msg` with trailing drafts (and their q rows) dropped until it carries at most `most`
    (the positions the server's session has left) and fits `max_request` bytes (a prefix of
    a proposal is a valid proposal, the first nodes of a tree a valid tree; γ = 0 always
    fits); unchanged if it fits."""
    n = max(0, min(len(msg.drafts), most, MAX_DRAFTS))
    sizes = [len(q.ids) for q in msg.q] if msg.q is not None else None
    tree = msg.parents is not None
    while n and verify_size(n, sizes[:n] if sizes is not None else None, tree) > max_request:
        n -= 1
    if n == len(msg.drafts):
        return msg
    q = msg.q[:n] if msg.q is not None and n else None
    parents = msg.parents[:n] if msg.parents is not None and n else None
    return Verify(msg.base, msg.drafts[:n], q, parents, msg.session, msg.round)
