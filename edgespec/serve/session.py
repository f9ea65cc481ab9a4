"""One generation on the server: its KV cache, committed tokens and acceptance rng.

`start()` prefills a prompt (or, after a reconnect, the client's whole committed sequence)
into a fresh cache and samples the next token; `verify()` runs one round for the client's
drafts: the target scores [last, d_1..d_γ] in one forward, the drafts are accepted with the
same `accept_greedy` / `accept_sampled` the local decode loop uses, and the cache is
truncated to the accepted prefix in `finally`, so a failing round never leaves it
half-advanced. Plain functions over a small dataclass; the worker thread calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import numpy as np

from edgespec.runtime.graph import GraphSession
from edgespec.runtime.sampling import SamplingParams, next_token
from edgespec.runtime.speculative import Proposal, accept_greedy, accept_sampled
from edgespec.runtime.target import Target
from edgespec.serve.protocol import BAD_REQUEST, OUT_OF_SYNC, ProtocolError, Result, Start, Verify


@dataclass
class ServerSession:
    target: Target  # its own KV cache over the shared graph sessions
    params: SamplingParams
    rng: np.random.Generator
    seq: list[int]  # committed tokens; the cache holds all but the last
    capacity: int
    rounds: int = 0


def start(stages: list[GraphSession], msg: Start, max_context: int) -> tuple[ServerSession, Result]:
    """A new session for msg.ids, with the first token after them."""
    t0 = perf_counter()
    if not msg.ids:
        raise ProtocolError("START carries no token ids: send the prompt's ids", BAD_REQUEST)
    if len(msg.ids) >= max_context:
        raise ProtocolError(
            f"the sequence is {len(msg.ids)} tokens but this server's context is {max_context}: "
            f"send at most {max_context - 1}",
            BAD_REQUEST,
        )
    try:
        params = SamplingParams(msg.temperature, msg.top_p, msg.top_k, msg.seed)
    except ValueError as e:
        raise ProtocolError(f"START: {e}", BAD_REQUEST) from None
    # room for the prompt and the requested new tokens, within what the server allows
    capacity = max(min(msg.capacity, max_context), len(msg.ids) + 1)
    target = Target(stages)
    target.reset(capacity)
    logits = target.forward(np.asarray(msg.ids, np.int64), keep=1)[-1]
    # a stream of its own: seeded like the device's, acceptance uniforms would equal the
    # uniforms that sampled the drafts, and the two would be correlated (a biased output)
    rng = np.random.default_rng(None if msg.seed is None else [msg.seed, 0x5E4E4])
    session = ServerSession(target, params, rng, [*msg.ids], capacity)
    session.seq.append(next_token(logits, params, rng))
    seconds = perf_counter() - t0
    return session, Result(0, session.seq[-1], len(session.seq), seconds)


def verify(s: ServerSession, msg: Verify) -> Result:
    """One round: accept a prefix of msg.drafts, append it and the target's next token."""
    t0 = perf_counter()
    base, g = len(s.seq), len(msg.drafts)
    if msg.base != base:
        raise ProtocolError(
            f"VERIFY after {msg.base} tokens, but this session holds {base}: the device and "
            "the server are out of step; start a new session (START with the committed tokens)",
            OUT_OF_SYNC,
        )
    if base + g > s.capacity:
        raise ProtocolError(
            f"this round would fill {base + g} positions, beyond the session's context of "
            f"{s.capacity}: draft fewer tokens or start with a larger capacity",
            BAD_REQUEST,
        )
    valid = base - 1  # what stays valid in the cache if the forward raises
    try:
        ids = np.asarray([s.seq[-1], *msg.drafts], np.int64)
        logits = s.target.forward(ids, keep=g + 1)
        if s.params.greedy:
            n, token = accept_greedy(msg.drafts, logits)
        else:
            n, token = accept_sampled(Proposal(msg.drafts, msg.q, 0.0), logits, s.params, s.rng)
        valid = base + n
    finally:
        s.target.truncate(valid)
    s.seq += [*msg.drafts[:n], token]
    s.rounds += 1
    return Result(n, token, len(s.seq), perf_counter() - t0)
