"""A server's stream is the one decode loop: it ends at a stop id (the session then holds
exactly the tokens sent), each streamed round's stats reach the policy of the chain member
that drafted it, and no second loop over speculative rounds exists in the package.

The streams run on a real in-process server (its worker, KV pool and target graphs), read
message by message: each TOKENS message is one round of the server's loop."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from split_server import serve_in_process

import edgespec
from edgespec import protocol as P
from edgespec.runtime.policies.draft_length import FixedLength, PerSource
from edgespec.runtime.registry import build
from edgespec.runtime.round import DraftLengthPolicy, Plan, Start
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.stats import RoundStats
from edgespec.serve.pool_verifier import PoolVerifier
from edgespec.serve.streaming import Streams, start_stream

# repeated text: prompt lookup finds continuations to propose
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18] * 4
MOST = 24


@pytest.fixture(scope="module")
def server(spec_bundles):
    s = serve_in_process(spec_bundles["self-draft"], mode="spec")  # every draft accepted
    yield s
    s.stop()


@pytest.fixture(scope="module")
def rows(server):
    """One conversation row of the server's pool, reused by every stream here."""
    state = server.state
    return PoolVerifier(state.worker, state.pool, state.stages)


def decoder(server, drafter: str):
    model = server.state.chat.model
    return build(model.graphs, replace(model.config, drafter=drafter, draft_policy="fixed:3"))


def stream(rows, new_decoder, stop_ids=frozenset(), most=MOST) -> list[P.Tokens]:
    """Prefill PROMPT into the row, then stream `most` tokens; the TOKENS messages sent."""
    params = SamplingParams()
    rows.prefill(Start(PROMPT, len(PROMPT) + most + 8, params, np.random.default_rng(0)))
    sent: list[P.Tokens] = []
    errors: list[Exception] = []
    streams = Streams(1, new_decoder)
    msg = P.Stream(len(rows.session.seq), most)
    s = start_stream(
        streams, rows, rows.session, msg, stop_ids, lambda t: sent.append(t) or True, errors.append
    )
    s.thread.join(60)
    assert not s.thread.is_alive() and not errors, errors
    assert sent and sent[-1].final and not any(t.final for t in sent[:-1])
    return sent


def test_a_stream_ends_at_a_stop_id_and_the_session_holds_what_was_sent(server, rows):
    free = stream(rows, lambda: decoder(server, "draft"))
    tokens = [t for m in free for t in m.ids]
    # a stop id that a round produces before its last token (never produced earlier)
    at = next(
        i + k
        for i, m in zip(np.cumsum([0] + [len(m.ids) for m in free]), free, strict=False)
        for k in range(len(m.ids) - 1)
        if m.ids[k] not in tokens[: i + k]
    )
    stop = tokens[at]
    sent = stream(rows, lambda: decoder(server, "draft"), frozenset({stop}))
    streamed = [t for m in sent for t in m.ids]
    assert streamed == tokens[: at + 1]  # cut at the stop id, as a local generation is
    assert sent[-1].length == len(PROMPT) + 1 + at + 1
    assert rows.session.seq == [*PROMPT, rows.session.seq[len(PROMPT)], *streamed]
    assert server.state.pool.lengths[rows.slot] == len(rows.session.seq) - 1


@dataclass
class Seen:
    """A policy that records the rounds it is shown."""

    inner: DraftLengthPolicy
    rounds: list[RoundStats] = field(default_factory=list)

    @property
    def max_length(self) -> int:
        return self.inner.max_length

    def plan(self, source: str | None = None) -> Plan:
        return self.inner.plan(source)

    def observe(self, stats: RoundStats) -> None:
        self.rounds.append(stats)
        self.inner.observe(stats)

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return self.inner.channel_estimates()


def test_streamed_rounds_reach_the_policy_of_the_chain_member_that_drafted_them(server, rows):
    made = []

    def new_decoder():
        d = decoder(server, "lookup+draft")
        d.policy = PerSource(Seen(FixedLength(3)), {"lookup": Seen(FixedLength(3))})
        made.append(d)
        return d

    sent = stream(rows, new_decoder, most=48)  # the output falls into a loop lookup copies
    policy = made[0].policy
    lookup, main = policy.apart["lookup"].rounds, policy.main.rounds
    assert lookup and main  # both members drafted rounds of this stream
    assert {s.source for s in lookup} == {"lookup"}
    assert {s.source for s in main} == {"draft"}
    every = sorted(lookup + main, key=lambda s: s.index)
    assert [s.index for s in every] == list(range(1, len(sent) + 1))


def test_the_package_has_one_decode_loop():
    """Only `runtime/decode.py`'s loop runs speculative rounds: a function elsewhere that
    calls `speculative_round`, or that both drafts (`.propose`, `_draft`) and verifies (`.submit`),
    would be a second loop to keep in step with it."""
    from pathlib import Path

    root = Path(edgespec.__file__).parent
    loops = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            called = {
                n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                for n in ast.walk(fn)
                if isinstance(n, ast.Call)
            }
            where = f"{path.relative_to(root)}:{fn.name}"
            drafts = bool(called & {"propose", "_draft"})
            if "speculative_round" in called or (drafts and "submit" in called):
                loops.append(where)
    assert loops == ["runtime/decode.py:decode_rounds", "runtime/decode.py:speculative_round"]


def test_a_stream_is_refused_when_the_session_has_no_room_left(server, rows):
    rows.prefill(Start(PROMPT, len(PROMPT), SamplingParams(), np.random.default_rng(0)))  # full
    msg = P.Stream(len(rows.session.seq), 4)
    streams = Streams(1, lambda: decoder(server, "draft"))
    with pytest.raises(P.ProtocolError, match="context is full"):
        start_stream(streams, rows, rows.session, msg, frozenset(), lambda t: True, print)
    assert streams.running == 0
